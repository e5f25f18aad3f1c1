package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/karamble/brmcp/directory"
)

// loadPolicyFile decodes a policy in the brmcpdir.json format (the keys of
// directory.Policy); an empty path is the zero policy (all defaults).
func loadPolicyFile(path string) (directory.Policy, error) {
	var p directory.Policy
	if path == "" {
		return p, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("policy %s: %w", path, err)
	}
	return p, nil
}

func splitUIDs(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func runDirectory(args []string) int {
	fs := flag.NewFlagSet("directory", flag.ExitOnError)
	datadir := fs.String("datadir", "", "data directory (index, peers, leads, journals, snapshot key, ledger)")
	policyFile := fs.String("policy", "", "policy JSON file (brmcpdir.json keys); flags below override it")
	admins := fs.String("admin", "", "comma-separated admin uids (policy admin_uids)")
	fee := fs.Int64("listing-fee", 0, "policy listing_fee_atoms")
	snapPrice := fs.Int64("snapshot-price", 0, "policy snapshot_price_atoms")
	searchPrice := fs.Int64("search-price", 0, "policy search_price_atoms")
	budgetMax := fs.Int64("test-budget-max", 0, "policy test_budget_max_atoms")
	expiry := fs.Int("expiry-days", 0, "policy expiry_days")
	cpm := fs.Int("calls-per-minute", 100_000, "policy calls_per_minute")
	recrawl := fs.Int("recrawl-hours", 0, "policy recrawl_hours")
	name := fs.String("name", "", "policy name")
	self := fs.String("self", "", "the directory's own uid (Config.SelfUID)")
	now := fs.Int64("now", 0, "fixed clock reading, unix seconds (0 = system clock)")
	chunk := fs.Int("chunk", 0, "wire chunk size (0 = default)")
	suggest := fs.Bool("suggester", true, "configure a Suggester (reported as suggest lines)")
	introduce := fs.Bool("introducer", true, "configure an Introducer (reported as introduce lines)")
	_ = fs.Parse(args)
	if *datadir == "" {
		logf("directory: -datadir is required")
		return 2
	}

	policy, err := loadPolicyFile(*policyFile)
	if err != nil {
		logf("directory: %v", err)
		return 1
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "admin":
			policy.AdminUIDs = splitUIDs(*admins)
		case "listing-fee":
			policy.ListingFeeAtoms = *fee
		case "snapshot-price":
			policy.SnapshotPriceAtoms = *snapPrice
		case "search-price":
			policy.SearchPriceAtoms = *searchPrice
		case "test-budget-max":
			policy.TestBudgetMaxAtoms = *budgetMax
		case "expiry-days":
			policy.ExpiryDays = *expiry
		case "recrawl-hours":
			policy.RecrawlHours = *recrawl
		case "calls-per-minute":
			policy.CallsPerMinute = *cpm
		case "name":
			policy.Name = *name
		}
	})
	// The rate limit defaults high here (tests call in bursts) unless the
	// policy file or the flag sets it.
	if policy.CallsPerMinute == 0 {
		policy.CallsPerMinute = *cpm
	}

	io := newLineIO()
	pending := newAsks(io)
	cfg := directory.Config{
		DataDir:   *datadir,
		Policy:    policy,
		Payer:     pending.payer(),
		SelfUID:   *self,
		Logf:      logf,
		ChunkSize: *chunk,
	}
	if *suggest {
		cfg.Suggester = pending.suggester()
	}
	if *introduce {
		cfg.Introducer = pending.introducer()
	}
	if *now != 0 {
		cfg.Clock = fixedClock{time.Unix(*now, 0)}
	}
	svc, err := directory.New(cfg)
	if err != nil {
		logf("directory: %v", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	router := svc.Start(ctx, io)
	defer func() {
		cancel()
		_ = svc.Close()
		router.Close()
	}()
	io.emit(line{Ready: map[string]any{"role": "directory", "name": svc.Name(), "pubKey": svc.PublicKey()}})
	billing := svc.Harness().Billing()
	err = readLines(func(v line) {
		switch {
		case v.PM != nil:
			router.HandlePM(v.PM.From, v.PM.Text)
		case v.Tip != nil:
			svc.CreditTip(v.Tip.From, v.Tip.Atoms)
			io.emit(line{Credited: &balanceLine{ID: v.Tip.ID, UID: v.Tip.From, Balance: billing.Balance(v.Tip.From)}})
		case v.Balance != nil:
			io.emit(line{Balance: &balanceLine{ID: v.Balance.ID, UID: v.Balance.UID, Balance: billing.Balance(v.Balance.UID)}})
		case v.Settle != nil:
			pending.settle(v.Settle.ID, v.Settle.Error)
		case v.KX != nil:
			svc.NotifyKX(v.KX.UID)
			io.emit(line{Ack: &settleLine{ID: v.KX.ID}})
		case v.Dump != nil:
			st, err := readDirectoryState(*datadir)
			if err != nil {
				io.emit(line{State: &stateLine{ID: v.Dump.ID, Error: err.Error()}})
				return
			}
			st.ID = v.Dump.ID
			st.PubKey = svc.PublicKey()
			st.Live = svc.LiveListings()
			io.emit(line{State: st})
		}
	})
	if err != nil {
		logf("directory: %v", err)
		return 1
	}
	return 0
}

// readDirectoryState reads the directory's persisted files. The service
// replaces each file by rename, so a read sees one whole version.
func readDirectoryState(dir string) (*stateLine, error) {
	st := &stateLine{AdminLog: []any{}}
	for name, dst := range map[string]*json.RawMessage{
		"index.json": &st.Index,
		"peers.json": &st.Peers,
		"leads.json": &st.Leads,
		"spend.json": &st.Spend,
	} {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case errors.Is(err, os.ErrNotExist):
			*dst = json.RawMessage("null")
			continue
		case err != nil:
			return nil, err
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		*dst = compact.Bytes()
	}
	f, err := os.Open(filepath.Join(dir, "adminlog.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		var entry any
		if err := json.Unmarshal(sc.Bytes(), &entry); err != nil {
			return nil, fmt.Errorf("adminlog.json: %w", err)
		}
		st.AdminLog = append(st.AdminLog, entry)
	}
	return st, sc.Err()
}
