package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// line is one JSON line in either direction between this process and the
// Python test fabric. Exactly one field is set.
//
//	{"pm":{"from":UID,"text":T}}          stdin: a PM delivered to this peer
//	{"pm":{"to":UID,"text":T}}            stdout: a PM this peer sends
//	{"tip":{"id":N,"from":UID,"atoms":A}} stdin (harness): credit a tip
//	{"credited":{"id":N,"balance":B}}     stdout (harness): the tip landed
//	{"balance":{"id":N,"uid":UID}}        stdin (harness): read a balance
//	{"exec":{"tool":NAME,"peer":UID}}     stdout (harness): a handler ran
//	{"pay":{"id":N,"payee":UID,"atoms":A}} stdout (bridge): the payer was asked
//	{"settle":{"id":N,"error":E}}         stdin (bridge): the payment outcome
//	{"ready":{...}}                       stdout: the peer is serving
//
// The directory and provider modes use tip/credited, balance, exec (the
// provider's handlers) and pay/settle (their payers) as above, and add
// (see directory.go, provider.go):
//
//	{"suggest":{"id":N,"invitee":U,"target":T}}   stdout: the Suggester was asked
//	{"introduce":{"id":N,"mediator":M,"target":T}} stdout: the Introducer was asked
//	    (both answered by a settle line with the same id, as pay is)
//	{"kx":{"id":N,"uid":UID}}             stdin (directory): NotifyKX(uid)
//	{"dump":{"id":N}}                     stdin (directory): read the state
//	{"ack":{"id":N,"error":E}}            stdout (directory): a kx line was handled
//	{"state":{"id":N,...,"error":E}}      stdout (directory): the state read (stateLine)
//	{"register":{"id":N,"directory":UID}} stdin (provider): Registrant.Register
//	{"registered":{"id":N,"error":E}}     stdout (provider): Register returned
//	{"notify":{"directory":UID,"status":S,"error":E}} stdout (provider): the
//	    Registrant's Notify callback ran
type line struct {
	PM         *pmLine        `json:"pm,omitempty"`
	Tip        *tipLine       `json:"tip,omitempty"`
	Credited   *balanceLine   `json:"credited,omitempty"`
	Balance    *balanceLine   `json:"balance,omitempty"`
	Exec       *execLine      `json:"exec,omitempty"`
	Pay        *payLine       `json:"pay,omitempty"`
	Settle     *settleLine    `json:"settle,omitempty"`
	Suggest    *kxAskLine     `json:"suggest,omitempty"`
	Introduce  *kxAskLine     `json:"introduce,omitempty"`
	KX         *uidLine       `json:"kx,omitempty"`
	Dump       *uidLine       `json:"dump,omitempty"`
	Ack        *settleLine    `json:"ack,omitempty"`
	State      *stateLine     `json:"state,omitempty"`
	Register   *registerLine  `json:"register,omitempty"`
	Registered *settleLine    `json:"registered,omitempty"`
	Notify     *notifyLine    `json:"notify,omitempty"`
	Ready      map[string]any `json:"ready,omitempty"`
}

type pmLine struct {
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	Text string `json:"text"`
}

type tipLine struct {
	ID    int64  `json:"id"`
	From  string `json:"from"`
	Atoms int64  `json:"atoms"`
}

type balanceLine struct {
	ID      int64  `json:"id"`
	UID     string `json:"uid,omitempty"`
	Balance int64  `json:"balance"`
}

type execLine struct {
	Tool string `json:"tool"`
	Peer string `json:"peer"`
}

type payLine struct {
	ID    int64  `json:"id"`
	Payee string `json:"payee"`
	Atoms int64  `json:"atoms"`
}

type settleLine struct {
	ID    int64  `json:"id"`
	Error string `json:"error"`
}

// kxAskLine is a Suggester or Introducer request reported to the test.
type kxAskLine struct {
	ID       int64  `json:"id"`
	Invitee  string `json:"invitee,omitempty"`
	Mediator string `json:"mediator,omitempty"`
	Target   string `json:"target"`
}

type uidLine struct {
	ID  int64  `json:"id"`
	UID string `json:"uid,omitempty"`
}

// stateLine is the directory's persisted state: each file of its data
// directory verbatim (null when the file does not exist yet) and the
// snapshot public key.
type stateLine struct {
	ID       int64           `json:"id"`
	Index    json.RawMessage `json:"index"`
	Peers    json.RawMessage `json:"peers"`
	Leads    json.RawMessage `json:"leads"`
	Spend    json.RawMessage `json:"spend"`
	AdminLog []any           `json:"adminlog"`
	PubKey   string          `json:"pubKey"`
	Live     int             `json:"live"`
	Error    string          `json:"error,omitempty"`
}

type registerLine struct {
	ID        int64  `json:"id"`
	Directory string `json:"directory"`
}

type notifyLine struct {
	Directory string `json:"directory"`
	Status    any    `json:"status"`
	Error     string `json:"error"`
}

// lineIO serializes writes of JSON lines to stdout.
type lineIO struct {
	mu  sync.Mutex
	out *bufio.Writer
	enc *json.Encoder
}

func newLineIO() *lineIO {
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	return &lineIO{out: out, enc: enc}
}

func (l *lineIO) emit(v line) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "emit:", err)
		os.Exit(1)
	}
	if err := l.out.Flush(); err != nil {
		os.Exit(1)
	}
}

// SendPM implements brmcp.PMSender by writing a pm line.
func (l *lineIO) SendPM(_ context.Context, peer, text string) error {
	l.emit(line{PM: &pmLine{To: peer, Text: text}})
	return nil
}

// readLines calls handle for every stdin line until EOF, then returns.
func readLines(handle func(line)) error {
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		raw, err := in.ReadBytes('\n')
		if len(raw) > 0 {
			var v line
			if jerr := json.Unmarshal(raw, &v); jerr != nil {
				fmt.Fprintln(os.Stderr, "bad line:", jerr)
			} else {
				handle(v)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}
