package main

import (
	"context"
	"encoding/json"
	"flag"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/karamble/brmcp/directory"
	"github.com/karamble/brmcp/server"
)

// TestToolPrice is the provider's default price for its test tool (atoms).
const TestToolPrice = 5_000

type testIn struct {
	Text string `json:"text,omitempty" jsonschema:"optional text echoed in the result"`
}

func runProvider(args []string) int {
	fs := flag.NewFlagSet("provider", flag.ExitOnError)
	datadir := fs.String("datadir", "", "data directory (ledger, journals, regfund.json)")
	allow := fs.String("allow", "", "comma-separated caller uids (the directory's among them)")
	price := fs.Int64("price", TestToolPrice, "price of the test tool (atoms)")
	description := fs.String("description", "interop provider", "registration description")
	tags := fs.String("tags", "", "comma-separated registration tags")
	testTool := fs.String("test-tool", "test", "the tool nominated for the directory's paid test call")
	testArgs := fs.String("test-args", "", "JSON object of the test call's arguments")
	testMax := fs.Int64("test-max", 20_000, "test.maxAtoms: the most the directory may spend on the test")
	autofund := fs.Bool("autofund", false, "AutoFund.Enabled")
	perRequest := fs.Int64("max-per-request", 0, "AutoFund.MaxAtomsPerRequest (0 = no cap)")
	perMonth := fs.Int64("max-per-month", 0, "AutoFund.MaxAtomsPerMonth (0 = no cap)")
	allowedDirs := fs.String("allowed-dirs", "", "AutoFund.AllowedDirectoryUIDs, comma-separated")
	name := fs.String("name", "", "the Registrant's MCP client name (empty: registrant)")
	now := fs.Int64("now", 0, "fixed clock reading, unix seconds (0 = system clock)")
	chunk := fs.Int("chunk", 0, "wire chunk size (0 = default)")
	cpm := fs.Int("calls-per-minute", 100_000, "per-caller rate limit")
	_ = fs.Parse(args)
	if *datadir == "" {
		logf("provider: -datadir is required")
		return 2
	}
	var spec directory.TestSpec
	spec.Tool = *testTool
	spec.MaxAtoms = *testMax
	if *testArgs != "" {
		if err := json.Unmarshal([]byte(*testArgs), &spec.Args); err != nil {
			logf("provider: -test-args: %v", err)
			return 2
		}
	}
	var tagList []string
	if *tags != "" {
		tagList = strings.Split(*tags, ",")
	}

	io := newLineIO()
	pending := newAsks(io)
	h, err := server.NewHarness(
		&mcp.Implementation{Name: "brmcp-interop-provider", Version: "0.1.0"},
		server.HarnessConfig{
			DataDir:        *datadir,
			AllowedPeers:   splitUIDs(*allow),
			CallsPerMinute: *cpm,
			ChunkSize:      *chunk,
			Logf:           logf,
		})
	if err != nil {
		logf("provider: %v", err)
		return 1
	}
	server.AddTool(h, &mcp.Tool{
		Name:        "test",
		Description: "A priced tool for a directory's verification call.",
	}, *price, func(ctx context.Context, peer string, in testIn) (any, error) {
		io.emit(line{Exec: &execLine{Tool: "test", Peer: peer}})
		return map[string]any{"ok": true, "text": in.Text, "charged": server.ChargedAtoms(ctx)}, nil
	})
	server.AddTool(h, &mcp.Tool{
		Name:        "echo",
		Description: "Echo the provided text back to the caller.",
	}, 0, func(_ context.Context, peer string, in echoIn) (any, error) {
		io.emit(line{Exec: &execLine{Tool: "echo", Peer: peer}})
		return map[string]string{"echo": in.Text}, nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := h.Start(ctx, io)
	defer router.Close()
	rcfg := directory.RegistrantConfig{
		Description: *description,
		Tags:        tagList,
		Test:        spec,
		AutoFund: directory.AutoFund{
			Enabled:              *autofund,
			MaxAtomsPerRequest:   *perRequest,
			MaxAtomsPerMonth:     *perMonth,
			AllowedDirectoryUIDs: splitUIDs(*allowedDirs),
		},
		DataDir: *datadir,
		Router:  router,
		Payer:   pending.payer(),
		Name:    *name,
		Logf:    logf,
		Notify: func(dir string, st directory.StatusOut, err error) {
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			io.emit(line{Notify: &notifyLine{Directory: dir, Status: st, Error: msg}})
		},
	}
	if *now != 0 {
		rcfg.Clock = fixedClock{time.Unix(*now, 0)}
	}
	reg, err := directory.NewRegistrant(rcfg)
	if err != nil {
		logf("provider: %v", err)
		return 1
	}
	reg.RegisterTools(h)
	reg.Start(ctx)
	io.emit(line{Ready: map[string]any{"role": "provider"}})
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
		case v.Settle != nil:
			pending.settle(v.Settle.ID, v.Settle.Error)
		case v.Register != nil:
			id, dir := v.Register.ID, v.Register.Directory
			go func() {
				msg := ""
				if err := reg.Register(ctx, dir); err != nil {
					msg = err.Error()
				}
				io.emit(line{Registered: &settleLine{ID: id, Error: msg}})
			}()
		}
	})
	if err != nil {
		logf("provider: %v", err)
		return 1
	}
	return 0
}
