package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/karamble/brmcp/server"
)

// FortunePrice is the paid tool's fixed price (atoms), as in the reference's
// brmcp-serve example.
const FortunePrice = 10_000

// DynUnitPrice is the dynamic tool's price per requested unit (atoms).
const DynUnitPrice = 250

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to echo back"`
}

type dynIn struct {
	Units int64 `json:"units" jsonschema:"units of work; the price is 250 atoms per unit"`
}

type blobIn struct {
	Bytes int `json:"bytes" jsonschema:"size of the returned data string"`
}

var fortunes = []string{
	"The relay carries more than messages.",
	"A tool worth calling is worth paying for.",
	"Consensus is silence that agrees.",
	"Your keys, your tools.",
	"Latency is just the network thinking it over.",
}

func runHarness(args []string) int {
	fs := flag.NewFlagSet("harness", flag.ExitOnError)
	datadir := fs.String("datadir", "", "data directory (ledger, journals)")
	allow := fs.String("allow", "", "comma-separated caller uids")
	chunk := fs.Int("chunk", 0, "wire chunk size (0 = default)")
	cpm := fs.Int("calls-per-minute", 100_000, "per-caller rate limit")
	_ = fs.Parse(args)

	io := newLineIO()
	var allowed []string
	if *allow != "" {
		allowed = strings.Split(*allow, ",")
	}
	h, err := server.NewHarness(
		&mcp.Implementation{Name: "brmcp-example", Version: "0.1.0"},
		server.HarnessConfig{
			DataDir:        *datadir,
			AllowedPeers:   allowed,
			CallsPerMinute: *cpm,
			ChunkSize:      *chunk,
			Logf:           logf,
		})
	if err != nil {
		logf("harness: %v", err)
		return 1
	}
	executed := func(tool, peer string) { io.emit(line{Exec: &execLine{Tool: tool, Peer: peer}}) }

	// echo and fortune are the reference's brmcp-serve example tools.
	server.AddTool(h, &mcp.Tool{
		Name:        "echo",
		Description: "Echo the provided text back to the caller.",
	}, 0, func(_ context.Context, peer string, in echoIn) (any, error) {
		executed("echo", peer)
		return map[string]string{"echo": in.Text}, nil
	})
	var nfortune atomic.Int64
	server.AddTool(h, &mcp.Tool{
		Name:        "fortune",
		Description: "Return a fortune. Paid per call.",
	}, FortunePrice, func(_ context.Context, peer string, _ struct{}) (any, error) {
		executed("fortune", peer)
		n := nfortune.Add(1) - 1
		return map[string]string{"fortune": fortunes[int(n)%len(fortunes)]}, nil
	})
	server.AddToolPriced(h, &mcp.Tool{
		Name:        "dyn",
		Description: "Priced per call: 250 atoms per unit.",
	}, func(_ context.Context, _ string, in dynIn) (int64, error) {
		if in.Units < 1 {
			return 0, fmt.Errorf("units must be at least 1")
		}
		return in.Units * DynUnitPrice, nil
	}, func(ctx context.Context, peer string, in dynIn) (any, error) {
		executed("dyn", peer)
		return map[string]int64{"units": in.Units, "charged": server.ChargedAtoms(ctx)}, nil
	})
	server.AddTool(h, &mcp.Tool{
		Name:        "blob",
		Description: "Return a string of the requested size.",
	}, 0, func(_ context.Context, peer string, in blobIn) (any, error) {
		executed("blob", peer)
		return map[string]string{"data": blobData(in.Bytes)}, nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := h.Start(ctx, io)
	defer router.Close()
	io.emit(line{Ready: map[string]any{"role": "harness"}})
	err = readLines(func(v line) {
		switch {
		case v.PM != nil:
			router.HandlePM(v.PM.From, v.PM.Text)
		case v.Tip != nil:
			if err := h.Billing().Credit(v.Tip.From, v.Tip.Atoms); err != nil {
				logf("credit: %v", err)
			}
			io.emit(line{Credited: &balanceLine{ID: v.Tip.ID, UID: v.Tip.From, Balance: h.Billing().Balance(v.Tip.From)}})
		case v.Balance != nil:
			io.emit(line{Balance: &balanceLine{ID: v.Balance.ID, UID: v.Balance.UID, Balance: h.Billing().Balance(v.Balance.UID)}})
		}
	})
	if err != nil {
		logf("harness: %v", err)
		return 1
	}
	return 0
}

// blobData is n bytes of a repeating printable pattern (the same on both
// sides of a differential test).
func blobData(n int) string {
	const pattern = "0123456789abcdefghijklmnopqrstuvwxyz"
	if n <= 0 {
		return ""
	}
	return strings.Repeat(pattern, n/len(pattern)+1)[:n]
}
