package main

import (
	"context"
	"errors"
	"flag"
	"sync"
	"time"

	"github.com/karamble/brmcp/bridge"
)

// fixedClock reads a constant time (so spend logs compare byte for byte)
// while waits run on the real clock.
type fixedClock struct{ now time.Time }

func (c fixedClock) Now() time.Time                         { return c.now }
func (c fixedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func runBridge(args []string) int {
	fs := flag.NewFlagSet("bridge", flag.ExitOnError)
	datadir := fs.String("datadir", "", "data directory (mcpclient.json, mcpspend.json)")
	bot := fs.String("bot", "", "the allowed bot uid")
	token := fs.String("token", "", "bearer token")
	name := fs.String("name", "", "bridge name (empty: brmcp-bridge)")
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	mode := fs.String("mode", "autopay", "approval or autopay")
	perCall := fs.Int64("per-call-cap", 100_000, "per-call cap (atoms)")
	perDay := fs.Int64("per-day-cap", 1_000_000, "rolling 24 h cap (atoms)")
	now := fs.Int64("now", 0, "fixed clock reading, unix seconds (0 = system clock)")
	chunk := fs.Int("chunk", 0, "wire chunk size (0 = default)")
	_ = fs.Parse(args)

	io := newLineIO()
	var (
		mu      sync.Mutex
		nextID  int64
		waiters = map[int64]chan string{}
	)
	payer := bridge.PayerFunc(func(ctx context.Context, payee string, atoms int64) error {
		mu.Lock()
		nextID++
		id := nextID
		ch := make(chan string, 1)
		waiters[id] = ch
		mu.Unlock()
		io.emit(line{Pay: &payLine{ID: id, Payee: payee, Atoms: atoms}})
		select {
		case msg := <-ch:
			if msg != "" {
				return errors.New(msg)
			}
			return nil
		case <-ctx.Done():
			mu.Lock()
			delete(waiters, id)
			mu.Unlock()
			return errors.New("payment not confirmed in time")
		}
	})
	cfg := bridge.Config{
		DataDir:    *datadir,
		Sender:     io,
		Payer:      payer,
		ListenAddr: *listen,
		Name:       *name,
		Logf:       logf,
		ChunkSize:  *chunk,
	}
	if *now != 0 {
		cfg.Clock = fixedClock{time.Unix(*now, 0)}
	}
	b, err := bridge.New(cfg)
	if err != nil {
		logf("bridge: %v", err)
		return 1
	}
	defer b.Close()
	err = b.ApplySettings(bridge.Settings{
		Enabled:         true,
		Token:           *token,
		Mode:            *mode,
		PerCallCapAtoms: *perCall,
		PerDayCapAtoms:  *perDay,
		AllowedBots:     []string{*bot},
	})
	if err != nil {
		logf("bridge settings: %v", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.Start(ctx); err != nil {
		logf("bridge start: %v", err)
		return 1
	}
	addr := b.ListenAddr()
	if addr == nil {
		logf("bridge: not listening")
		return 1
	}
	io.emit(line{Ready: map[string]any{"role": "bridge", "addr": addr.String()}})
	err = readLines(func(v line) {
		switch {
		case v.PM != nil:
			b.HandlePM(v.PM.From, v.PM.Text)
		case v.Settle != nil:
			mu.Lock()
			ch := waiters[v.Settle.ID]
			delete(waiters, v.Settle.ID)
			mu.Unlock()
			if ch != nil {
				ch <- v.Settle.Error
			}
		}
	})
	if err != nil {
		logf("bridge: %v", err)
		return 1
	}
	return 0
}
