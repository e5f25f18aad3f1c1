package main

// A simulated Lightning wallet shared by every client of this process. It
// plays the part dcrlnd plays for brclient: the payee's GetInvoice returns an
// invoice string that encodes its id, amount and expiry; the tipper's
// DecodeInvoice reads them back and PayInvoice marks the invoice paid; the
// payee's TrackInvoice returns the amount once (and only once) it is paid.
// Invoices that are not ours (the relay's "free" scheme) are handled exactly
// like clientintf.FreePaymentClient does. Paid invoices persist in a JSON file
// so a restart on the same root keeps them.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/companyzero/bisonrelay/client/clientintf"
	"github.com/companyzero/bisonrelay/rpc"
)

const simInvoicePrefix = "brnetsim1"

// simInvoiceLifetime is how long a tip invoice stays payable (dcrlnd's
// default invoice expiry is one hour).
const simInvoiceLifetime = time.Hour

type simInvoice struct {
	id     string
	matoms int64
	expiry time.Time
}

func (inv simInvoice) String() string {
	return fmt.Sprintf("%s:%s:%d:%d", simInvoicePrefix, inv.id, inv.matoms, inv.expiry.Unix())
}

func parseSimInvoice(s string) (simInvoice, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || parts[0] != simInvoicePrefix {
		return simInvoice{}, false
	}
	m, err1 := strconv.ParseInt(parts[2], 10, 64)
	e, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil || len(parts[1]) != 32 {
		return simInvoice{}, false
	}
	return simInvoice{id: parts[1], matoms: m, expiry: time.Unix(e, 0)}, true
}

// simLedger records which simulated invoices were paid.
type simLedger struct {
	mtx     sync.Mutex
	path    string
	paid    map[string]int64 // invoice id -> milliatoms paid
	changed chan struct{}    // closed and replaced on every payment
}

func newSimLedger(path string) (*simLedger, error) {
	l := &simLedger{path: path, paid: map[string]int64{}, changed: make(chan struct{})}
	b, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(b, &l.paid); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	} else if !os.IsNotExist(err) {
		return nil, err
	}
	return l, nil
}

func (l *simLedger) markPaid(inv simInvoice) error {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	if _, ok := l.paid[inv.id]; ok {
		return errors.New("invoice is already paid")
	}
	l.paid[inv.id] = inv.matoms
	b, err := json.Marshal(l.paid)
	if err == nil {
		err = os.WriteFile(l.path, b, 0o600)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return err
}

func (l *simLedger) status(id string) (int64, bool, <-chan struct{}) {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	m, ok := l.paid[id]
	return m, ok, l.changed
}

// simPayClient is one client's wallet view of the shared ledger.
type simPayClient struct {
	ledger *simLedger
}

var _ clientintf.PaymentClient = (*simPayClient)(nil)

func (pc *simPayClient) PayScheme() string { return rpc.PaySchemeFree }

func (pc *simPayClient) pay(invoice string) (int64, error) {
	inv, ok := parseSimInvoice(invoice)
	if !ok {
		return 0, nil // relay (free scheme) invoice
	}
	if time.Now().After(inv.expiry) {
		return 0, clientintf.ErrInvoiceExpired
	}
	return 0, pc.ledger.markPaid(inv)
}

func (pc *simPayClient) PayInvoice(_ context.Context, invoice string) (int64, error) {
	return pc.pay(invoice)
}

func (pc *simPayClient) PayInvoiceAmount(_ context.Context, invoice string, _ int64) (int64, error) {
	return pc.pay(invoice)
}

func (pc *simPayClient) GetInvoice(_ context.Context, matoms int64, _ func(int64)) (string, error) {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	inv := simInvoice{id: hex.EncodeToString(id[:]), matoms: matoms,
		expiry: time.Now().Add(simInvoiceLifetime)}
	return inv.String(), nil
}

func (pc *simPayClient) DecodeInvoice(ctx context.Context, invoice string) (clientintf.DecodedInvoice, error) {
	inv, ok := parseSimInvoice(invoice)
	if !ok {
		return clientintf.FreePaymentClient{}.DecodeInvoice(ctx, invoice)
	}
	id, _ := hex.DecodeString(inv.id)
	return clientintf.DecodedInvoice{ID: id, MAtoms: inv.matoms, ExpiryTime: inv.expiry}, nil
}

func (pc *simPayClient) IsInvoicePaid(context.Context, int64, string) error { return nil }

// TrackInvoice blocks until the invoice is paid (returning its amount),
// expires (clientintf.ErrInvoiceExpired) or ctx ends.
func (pc *simPayClient) TrackInvoice(ctx context.Context, invoice string, _ int64) (int64, error) {
	inv, ok := parseSimInvoice(invoice)
	if !ok {
		return 0, nil
	}
	for {
		m, paid, changed := pc.ledger.status(inv.id)
		if paid {
			return m, nil
		}
		wait := time.Until(inv.expiry)
		if wait <= 0 {
			return 0, clientintf.ErrInvoiceExpired
		}
		timer := time.NewTimer(wait)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return 0, ctx.Err()
		}
		timer.Stop()
	}
}

// IsPaymentCompleted reports a payment started before a restart: PayInvoice
// is synchronous here, so an invoice is either paid or was never paid.
func (pc *simPayClient) IsPaymentCompleted(_ context.Context, invoice string) (int64, error) {
	inv, ok := parseSimInvoice(invoice)
	if !ok {
		return 0, nil
	}
	if _, paid, _ := pc.ledger.status(inv.id); paid {
		return 0, nil
	}
	return 0, errors.New("payment not completed")
}
