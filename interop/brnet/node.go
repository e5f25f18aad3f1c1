package main

// One brclient-equivalent user: a bisonrelay client.Client on its own
// brclient-style root, plus a clientrpc server (rpcserver with the chat,
// payments, posts, GC, resources, content and version services, the replay
// logs under <root>/<nick>/db/replaymsglog and brclient's TipUser guards)
// behind a mutual-TLS websocket listener, and a status server like
// brclientd's on a second mutual-TLS listener (status.go).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/companyzero/bisonrelay/client"
	"github.com/companyzero/bisonrelay/client/clientdb"
	"github.com/companyzero/bisonrelay/client/clientintf"
	"github.com/companyzero/bisonrelay/client/resources"
	"github.com/companyzero/bisonrelay/client/rpcserver"
	"github.com/companyzero/bisonrelay/zkidentity"
	"github.com/decred/slog"
	"golang.org/x/text/collate"
	"golang.org/x/text/language"
)

type nodeCfg struct {
	nick       string
	dir        string // <root>/<nick>
	rpcPort    int
	statusPort int
	relayAddr  string
	noWallet   bool
	ledger     *simLedger
	opts       *options
}

type node struct {
	cfg nodeCfg

	mtx     sync.Mutex
	c       *client.Client
	cancel  context.CancelFunc
	done    chan struct{}
	logFile *os.File
	online  bool
}

// loopbackOnly is the DialFunc for the client's HTTP needs (the exchange-rate
// fetch): everything outside loopback is refused without a DNS lookup.
func loopbackOnly(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("brnet: refusing to dial %s (loopback only)", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (n *node) certPaths() rpcCertPaths { return certPathsIn(n.cfg.dir) }

func (n *node) rpcURL() string { return fmt.Sprintf("wss://127.0.0.1:%d/ws", n.cfg.rpcPort) }

func (n *node) statusURL() string { return fmt.Sprintf("https://127.0.0.1:%d", n.cfg.statusPort) }

// start runs the client and its clientrpc server until stop.
func (n *node) start(parent context.Context) error {
	n.mtx.Lock()
	defer n.mtx.Unlock()
	if n.c != nil {
		return errors.New("already running")
	}
	dir := n.cfg.dir
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "logs", "brclient.log"),
		os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	bknd := slog.NewBackend(logf)
	lvl, _ := slog.LevelFromString(n.cfg.opts.logLevel)
	logger := func(sub string) slog.Logger {
		l := bknd.Logger(sub)
		l.SetLevel(lvl)
		return l
	}

	db, err := clientdb.New(clientdb.Config{
		Root:          filepath.Join(dir, "db"),
		MsgsRoot:      filepath.Join(dir, "logs"),
		DownloadsRoot: filepath.Join(dir, "downloads"),
		EmbedsRoot:    filepath.Join(dir, "embeds"),
		Logger:        logger("FDDB"),
		ChunkSize:     10 * 1024 * 1024,
	})
	if err != nil {
		logf.Close()
		return fmt.Errorf("clientdb: %w", err)
	}

	var pc clientintf.PaymentClient = &simPayClient{ledger: n.cfg.ledger}
	if n.cfg.noWallet {
		pc = clientintf.FreePaymentClient{}
	}

	latency := n.cfg.opts.latency
	dialTCP := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := loopbackOnly(ctx, network, addr)
		if err != nil || latency <= 0 {
			return c, err
		}
		return newDelayedConn(c, latency), nil
	}
	nick := n.cfg.nick
	o := n.cfg.opts
	// Resource requests from remote users go to the clientrpc
	// ResourcesService.RequestsStream, as with brclient's clientrpc upstream.
	rtr := resources.NewRouter()
	ccfg := client.Config{
		ResourcesProvider: rtr,
		DB:                db,
		Dialer:            clientintf.WithDialer(n.cfg.relayAddr, logger("DIAL"), dialTCP),
		DialFunc:          loopbackOnly,
		PayClient:         pc,
		Logger:            logger,
		ReconnectDelay:    o.reconnectDelay,
		CompressLevel:     o.compressLevel,
		Collator:          collate.New(language.AmericanEnglish, collate.Loose),
		CertConfirmer: func(context.Context, *tls.ConnectionState, *zkidentity.PublicIdentity) error {
			return nil
		},
		LocalIDIniter: func(context.Context) (*zkidentity.FullIdentity, error) {
			return zkidentity.New(nick, nick)
		},
		TipUserRestartDelay:          o.tipRestartDelay,
		TipUserReRequestInvoiceDelay: o.tipReRequestInvoiceDelay,
		TipUserMaxLifetime:           o.tipMaxLifetime,
		TipUserPayRetryDelayFactor:   o.tipPayRetryDelayFactor,
		SendReceiveReceipts:          true,
		AutoHandshakeInterval:        21 * 24 * time.Hour,
		AutoRemoveIdleUsersInterval:  60 * 24 * time.Hour,
	}
	c, err := client.New(ccfg)
	if err != nil {
		logf.Close()
		return err
	}

	lis, err := rpcTLSListener(fmt.Sprintf("127.0.0.1:%d", n.cfg.rpcPort), n.certPaths())
	if err != nil {
		logf.Close()
		return fmt.Errorf("clientrpc listener for %s: %w", nick, err)
	}
	rpcsLog := logger("RPCS")
	srv := rpcserver.New(rpcserver.Config{JSONRPCListeners: []net.Listener{lis}, Log: rpcsLog})
	srv.InitVersionService("brclient", "brnet-0.2.4")
	replay := filepath.Join(dir, "db", "replaymsglog")
	initErr := errors.Join(
		srv.InitChatService(rpcserver.ChatServerCfg{Client: c, Log: rpcsLog, RootReplayMsgLogs: replay}),
		srv.InitPostsService(rpcserver.PostsServerCfg{Client: c, Log: rpcsLog, RootReplayMsgLogs: replay}),
		srv.InitPaymentsService(rpcserver.PaymentsServerCfg{
			Client: c, Log: rpcsLog, RootReplayMsgLogs: replay,
			RPCAllowRemoteSendTip:  o.allowRemoteTip,
			RPCMaxRemoteSendTipAmt: o.maxRemoteTipAmt,
			// brclient's guards (brclient/appstate.go).
			OnTipUser: func(_ clientintf.UserID, dcrAmount float64) error {
				if !o.allowRemoteTip {
					return fmt.Errorf("remote tip sending not allowed")
				}
				if o.maxRemoteTipAmt > 0 && dcrAmount > o.maxRemoteTipAmt {
					return fmt.Errorf("tip exceeds max limit: %v", o.maxRemoteTipAmt)
				}
				return nil
			},
		}),
		srv.InitGCService(rpcserver.GCServerCfg{Client: c, Log: rpcsLog, RootReplayMsgLogs: replay}),
		srv.InitResourcesService(rpcserver.ResourcesServerCfg{Client: c, Log: rpcsLog, Router: rtr}),
		srv.InitContentService(rpcserver.ContentServerCfg{Client: c, Log: rpcsLog, RootReplayMsgLogs: replay}),
	)
	if initErr != nil {
		lis.Close()
		logf.Close()
		return initErr
	}
	statusLis, err := rpcTLSListener(fmt.Sprintf("127.0.0.1:%d", n.cfg.statusPort), n.certPaths())
	if err != nil {
		lis.Close()
		logf.Close()
		return fmt.Errorf("status listener for %s: %w", nick, err)
	}
	statusSrv := newStatusServer(c, logger("STAT"))

	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		serveStatus(ctx, statusSrv, statusLis)
	}()
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logf.WriteString(fmt.Sprintf("client run ended: %v\n", err))
		}
	}()
	go func() {
		defer wg.Done()
		_ = srv.Run(ctx)
		lis.Close()
	}()
	go func() { wg.Wait(); close(done) }()

	select {
	case <-c.AddressBookLoaded():
	case <-time.After(30 * time.Second):
		cancel()
		return fmt.Errorf("%s: address book did not load", nick)
	}
	n.c, n.cancel, n.done, n.logFile, n.online = c, cancel, done, logf, true
	return nil
}

// stop ends the client and its clientrpc server and waits for both.
func (n *node) stop() {
	n.mtx.Lock()
	cancel, done, logf := n.cancel, n.done, n.logFile
	n.c, n.cancel, n.done, n.logFile = nil, nil, nil, nil
	n.mtx.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
	}
	logf.Close()
}

func (n *node) client() *client.Client {
	n.mtx.Lock()
	defer n.mtx.Unlock()
	return n.c
}

// setOnline disconnects the client from the relay (and keeps it off) or
// lets it reconnect.
func (n *node) setOnline(on bool) error {
	n.mtx.Lock()
	c := n.c
	if c != nil {
		n.online = on
	}
	n.mtx.Unlock()
	if c == nil {
		return errors.New("client is stopped")
	}
	if on {
		c.GoOnline()
	} else {
		c.RemainOffline()
	}
	return nil
}

// waitConnected waits until the client has a relay session.
func (n *node) waitConnected(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c := n.client(); c != nil && c.ServerSession() != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: no relay session after %s", n.cfg.nick, timeout)
}

func (n *node) status() map[string]any {
	n.mtx.Lock()
	defer n.mtx.Unlock()
	st := map[string]any{"nick": n.cfg.nick, "running": n.c != nil, "online": n.c != nil && n.online}
	if n.c != nil {
		st["connected"] = n.c.ServerSession() != nil
	}
	return st
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
