// Command brnet runs a real Bison Relay network on loopback: a relay
// (bisonrelay's server package) and N users, each a bisonrelay client with a
// clientrpc server on a mutual-TLS websocket exactly like brclient's, KX'd
// with each other (every pair, or the pairs -kx names), and a status server
// like brclientd's (POST /contacts/suggest-kx, the client's SuggestKX) on
// the same mutual TLS. Tips complete through a simulated wallet (or never,
// with brclient's stock no-wallet payment client). Nothing outside loopback
// is contacted.
//
//	brnet -root DIR [-users alice,bob] [-latency 250ms] [-nowallet bob|all]
//	      [-tiprestartdelay 1m] [-reconnectdelay 5s] [-kx all|none|a:b,...] ...
//
// When everything is up it writes <root>/brnet.json (relay address, control
// URL, and per user: nick, uid, brrpcurl, brstatusurl, certificate paths,
// the bot conf)
// and prints one line "brnet ready <path of brnet.json>" on stdout. The root
// is persistent: a restart keeps identities, KX, ports and replay logs.
// SIGINT/SIGTERM stop it cleanly. Nicks follow brmcp-fakebr's rule (1-32 of
// letters, digits, _ . -, not starting with . or -): each names a directory
// under -root, so any other name is refused (exit status 2) with one line.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/companyzero/bisonrelay/server"
	"github.com/companyzero/bisonrelay/server/settings"
	"golang.org/x/sync/errgroup"
)

type options struct {
	root                     string
	users                    []string
	noWallet                 map[string]bool
	latency                  time.Duration
	reconnectDelay           time.Duration
	tipRestartDelay          time.Duration
	tipReRequestInvoiceDelay time.Duration
	tipMaxLifetime           time.Duration
	tipPayRetryDelayFactor   time.Duration
	allowRemoteTip           bool
	maxRemoteTipAmt          float64
	compressLevel            int
	logLevel                 string
	kxAll                    bool        // -kx all: KX every pair at start
	kxPairs                  [][2]string // -kx a:b,...: KX only these pairs at start
}

// state is what a root keeps across restarts (<root>/brnet-state.json).
type state struct {
	RelayPort   int               `json:"relayPort"`
	ControlPort int               `json:"controlPort"`
	Users       []string          `json:"users"`
	RPCPorts    map[string]int    `json:"rpcPorts"`
	RPCUser     map[string]string `json:"rpcUser"`
	RPCPass     map[string]string `json:"rpcPass"`
	StatusPorts map[string]int    `json:"statusPorts"`
}

func freePort() (int, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func loadState(path string) (*state, error) {
	st := &state{RPCPorts: map[string]int{}, RPCUser: map[string]string{}, RPCPass: map[string]string{},
		StatusPorts: map[string]int{}}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, m := range []*map[string]string{&st.RPCUser, &st.RPCPass} {
		if *m == nil {
			*m = map[string]string{}
		}
	}
	if st.RPCPorts == nil {
		st.RPCPorts = map[string]int{}
	}
	if st.StatusPorts == nil {
		st.StatusPorts = map[string]int{}
	}
	return st, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("brnet", flag.ContinueOnError)
	o := &options{}
	users := fs.String("users", "alice,bob", "comma-separated nicks of the users to run (added to those already in -root)")
	noWallet := fs.String("nowallet", "", "comma-separated nicks (or \"all\") that use brclient's stock no-wallet payment client: their tips never complete")
	fs.StringVar(&o.root, "root", "", "persistent root directory (required)")
	fs.DurationVar(&o.latency, "latency", 0, "one-way latency added to every message a user sends to the relay")
	fs.DurationVar(&o.reconnectDelay, "reconnectdelay", 5*time.Second, "brclient's relay reconnect delay")
	fs.DurationVar(&o.tipRestartDelay, "tiprestartdelay", time.Minute, "brclient's tipuser.restartdelay: TipUser blocks this long after start")
	fs.DurationVar(&o.tipReRequestInvoiceDelay, "tiprerequestinvoicedelay", 24*time.Hour, "brclient's tipuser.rerequestinvoicedelay")
	fs.DurationVar(&o.tipMaxLifetime, "tipmaxlifetime", 72*time.Hour, "brclient's tipuser.maxlifetime")
	fs.DurationVar(&o.tipPayRetryDelayFactor, "tippayretrydelayfactor", 12*time.Second, "brclient's tipuser.payretrydelayfactor")
	fs.BoolVar(&o.allowRemoteTip, "rpcallowremotesendtip", true, "brclient's rpcallowremotesendtip")
	fs.Float64Var(&o.maxRemoteTipAmt, "rpcmaxremotesendtipamt", -1, "brclient's rpcmaxremotesendtipamt (DCR, applied when > 0)")
	fs.IntVar(&o.compressLevel, "compresslevel", 4, "brclient's compresslevel (zlib level of routed messages)")
	fs.StringVar(&o.logLevel, "loglevel", "info", "log level of the relay and client logs under -root")
	kx := fs.String("kx", "all", "pairs KX'd at start: \"all\", \"none\" or comma-separated nick:nick pairs (pairs KX'd on an earlier run stay KX'd)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch *kx {
	case "all":
		o.kxAll = true
	case "none":
	default:
		for _, p := range splitList(*kx) {
			a, b, ok := strings.Cut(p, ":")
			if !ok || a == b {
				return nil, fmt.Errorf("invalid -kx pair %q: use nick:nick with two different nicks, \"all\" or \"none\"", p)
			}
			for _, nick := range []string{a, b} {
				if err := checkNick(nick, " in -kx"); err != nil {
					return nil, err
				}
			}
			o.kxPairs = append(o.kxPairs, [2]string{a, b})
		}
	}
	if o.root == "" {
		return nil, errors.New("-root is required")
	}
	o.users = splitList(*users)
	for _, n := range o.users {
		if err := checkNick(n, ""); err != nil {
			return nil, err
		}
	}
	o.noWallet = map[string]bool{}
	for _, n := range splitList(*noWallet) {
		if n != "all" {
			if err := checkNick(n, " in -nowallet"); err != nil {
				return nil, err
			}
		}
		o.noWallet[n] = true
	}
	return o, nil
}

// nickRe is brmcp-fakebr's rule for nicks (brmcp/testing/fakebr/cli.py). A
// nick names the user's directory under -root, so path separators, "." and
// ".." are refused with it.
var nickRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`)

// checkNick returns a one-line error when nick breaks nickRe; where says
// which flag named it (empty for -users).
func checkNick(nick, where string) error {
	if nickRe.MatchString(nick) {
		return nil
	}
	return fmt.Errorf("invalid nick %q%s: use 1 to 32 letters, digits, '_', '.' or '-', "+
		"not starting with '.' or '-'", nick, where)
}

// network is one running brnet.
type network struct {
	opts    *options
	st      *state
	relay   string
	nodes   []*node
	byNick  map[string]*node
	control string
}

func (nw *network) userInfo(n *node) map[string]any {
	p := n.certPaths()
	info := map[string]any{
		"nick":           n.cfg.nick,
		"root":           n.cfg.dir,
		"brrpcurl":       n.rpcURL(),
		"servercertpath": p.Cert,
		"serverkeypath":  p.Key,
		"cacertpath":     p.CA,
		"clientcertpath": p.ClientCert,
		"clientkeypath":  p.ClientKey,
		"rpcuser":        nw.st.RPCUser[n.cfg.nick],
		"rpcpass":        nw.st.RPCPass[n.cfg.nick],
		"conf":           filepath.Join(n.cfg.dir, "bot.conf"),
		"nowallet":       n.cfg.noWallet,
		"brstatusurl":    n.statusURL(),
	}
	if c := n.client(); c != nil {
		info["uid"] = c.PublicID().String()
	}
	return info
}

// writeBotConf writes a bisonbotkit-style conf for the user (key=value, the
// keys brmcp-serve and brmcp-bridge read).
func (nw *network) writeBotConf(n *node) error {
	p := n.certPaths()
	datadir := filepath.Join(n.cfg.dir, "bot")
	lines := [][2]string{
		{"datadir", datadir},
		{"brrpcurl", n.rpcURL()},
		{"servercertpath", p.Cert},
		{"clientcertpath", p.ClientCert},
		{"clientkeypath", p.ClientKey},
		{"rpcuser", nw.st.RPCUser[n.cfg.nick]},
		{"rpcpass", nw.st.RPCPass[n.cfg.nick]},
		{"debug", "info"},
		{"logfile", filepath.Join(datadir, "logs", "bot.log")},
		{"maxlogfiles", "5"},
		{"maxbufferlines", "1000"},
	}
	var out []byte
	for _, kv := range lines {
		out = append(out, []byte(kv[0]+"="+kv[1]+"\n")...)
	}
	return os.WriteFile(filepath.Join(n.cfg.dir, "bot.conf"), out, 0o600)
}

// startPairs are the pairs -kx asks for: every pair, or the listed ones.
func (nw *network) startPairs() ([][2]*node, error) {
	var out [][2]*node
	if nw.opts.kxAll {
		for i := range nw.nodes {
			for j := i + 1; j < len(nw.nodes); j++ {
				out = append(out, [2]*node{nw.nodes[i], nw.nodes[j]})
			}
		}
		return out, nil
	}
	for _, p := range nw.opts.kxPairs {
		a, b := nw.byNick[p[0]], nw.byNick[p[1]]
		if a == nil || b == nil {
			return nil, fmt.Errorf("-kx pair %s:%s names a user that is not in -users", p[0], p[1])
		}
		out = append(out, [2]*node{a, b})
	}
	return out, nil
}

// kxPairs KXs each pair that is not KX'd yet (pairs run concurrently), by
// an invite written by the first and accepted by the second.
func kxPairs(pairs [][2]*node, timeout time.Duration) error {
	var g errgroup.Group
	for _, p := range pairs {
		a, b := p[0].client(), p[1].client()
		if a == nil || b == nil {
			return fmt.Errorf("KX between %s and %s: a client is stopped", p[0].cfg.nick, p[1].cfg.nick)
		}
		if a.UserExists(b.PublicID()) && b.UserExists(a.PublicID()) {
			continue
		}
		g.Go(func() error {
			inv, err := a.WriteNewInvite(io.Discard, nil)
			if err != nil {
				return err
			}
			if err := b.AcceptInvite(inv); err != nil {
				return err
			}
			deadline := time.Now().Add(timeout)
			for time.Now().Before(deadline) {
				if a.UserExists(b.PublicID()) && b.UserExists(a.PublicID()) {
					return nil
				}
				time.Sleep(20 * time.Millisecond)
			}
			return fmt.Errorf("KX between %s and %s did not complete", a.LocalNick(), b.LocalNick())
		})
	}
	return g.Wait()
}

func run(ctx context.Context, o *options) error {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return err
	}
	o.root = root
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	statePath := filepath.Join(root, "brnet-state.json")
	st, err := loadState(statePath)
	if err != nil {
		return err
	}
	for _, u := range st.Users {
		if err := checkNick(u, ""); err != nil {
			return fmt.Errorf("%s: %w", statePath, err)
		}
	}
	for _, u := range o.users {
		found := false
		for _, have := range st.Users {
			found = found || have == u
		}
		if !found {
			st.Users = append(st.Users, u)
		}
	}
	if len(st.Users) < 1 {
		return errors.New("no users")
	}
	for _, u := range st.Users {
		if st.RPCPorts[u] == 0 {
			if st.RPCPorts[u], err = freePort(); err != nil {
				return err
			}
		}
		if st.StatusPorts[u] == 0 {
			if st.StatusPorts[u], err = freePort(); err != nil {
				return err
			}
		}
		if st.RPCUser[u] == "" {
			st.RPCUser[u], st.RPCPass[u] = randHex(4), randHex(8)
		}
	}
	if st.ControlPort == 0 {
		if st.ControlPort, err = freePort(); err != nil {
			return err
		}
	}

	// Relay.
	relayDir := filepath.Join(root, "relay")
	if err := os.MkdirAll(relayDir, 0o700); err != nil {
		return err
	}
	relayLog, err := os.OpenFile(filepath.Join(relayDir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer relayLog.Close()
	scfg := settings.New()
	scfg.Root = relayDir
	scfg.RoutedMessages = filepath.Join(relayDir, settings.ZKSRoutedMessages)
	scfg.PaidRVs = filepath.Join(relayDir, settings.ZKSPaidRVs)
	scfg.LogFile = filepath.Join(relayDir, "brserver.log")
	scfg.Listen = []string{fmt.Sprintf("127.0.0.1:%d", st.RelayPort)}
	scfg.Profiler = ""
	scfg.DebugLevel = o.logLevel
	scfg.LogStdOut = relayLog
	svr, err := server.NewServer(scfg)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	relayDone := make(chan error, 1)
	go func() { relayDone <- svr.Run(ctx) }()
	var relayAddr string
	for i := 0; relayAddr == ""; i++ {
		if addrs := svr.BoundAddrs(); len(addrs) > 0 {
			relayAddr = addrs[0].String()
			break
		}
		select {
		case err := <-relayDone:
			return fmt.Errorf("relay stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if i > 1000 {
			return errors.New("relay did not start listening")
		}
	}
	_, portStr, _ := net.SplitHostPort(relayAddr)
	st.RelayPort, _ = strconv.Atoi(portStr)
	if err := writeJSON(statePath, st); err != nil {
		return err
	}

	ledger, err := newSimLedger(filepath.Join(root, "simwallet.json"))
	if err != nil {
		return err
	}
	nw := &network{opts: o, st: st, relay: relayAddr, byNick: map[string]*node{}}
	for _, u := range st.Users {
		n := &node{cfg: nodeCfg{nick: u, dir: filepath.Join(root, u), rpcPort: st.RPCPorts[u],
			statusPort: st.StatusPorts[u], relayAddr: relayAddr, noWallet: o.noWallet[u] || o.noWallet["all"], ledger: ledger, opts: o}}
		nw.nodes = append(nw.nodes, n)
		nw.byNick[u] = n
	}
	defer func() {
		var wg sync.WaitGroup
		for _, n := range nw.nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.stop() }()
		}
		wg.Wait()
	}()
	var g errgroup.Group
	for _, n := range nw.nodes {
		g.Go(func() error {
			if err := n.start(ctx); err != nil {
				return err
			}
			return n.waitConnected(30 * time.Second)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	pairs, err := nw.startPairs()
	if err != nil {
		return err
	}
	if err := kxPairs(pairs, 60*time.Second); err != nil {
		return err
	}
	for _, n := range nw.nodes {
		if err := nw.writeBotConf(n); err != nil {
			return err
		}
	}

	ctl, err := nw.startControl(ctx)
	if err != nil {
		return err
	}
	defer ctl.Close()

	infoPath := filepath.Join(root, "brnet.json")
	if err := nw.writeInfo(infoPath); err != nil {
		return err
	}
	fmt.Printf("brnet ready %s\n", infoPath)

	select {
	case <-ctx.Done():
		return nil
	case err := <-relayDone:
		return fmt.Errorf("relay stopped: %v", err)
	}
}

func (nw *network) writeInfo(path string) error {
	users := []map[string]any{}
	for _, n := range nw.nodes {
		users = append(users, nw.userInfo(n))
	}
	return writeJSON(path, map[string]any{
		"root":      nw.opts.root,
		"relay":     nw.relay,
		"control":   nw.control,
		"pid":       os.Getpid(),
		"latencyMs": nw.opts.latency.Milliseconds(),
		"users":     users,
	})
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "brnet: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "brnet: %v\n", err)
		os.Exit(1)
	}
}
