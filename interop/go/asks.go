package main

import (
	"context"
	"errors"
	"sync"

	"github.com/karamble/brmcp/directory"
)

// asks reports requests that need the test's decision (a payment, a KX
// suggestion, an introduction) as stdout lines and blocks until a settle
// line with the same id arrives on stdin. Ids are unique across kinds.
type asks struct {
	io      *lineIO
	mu      sync.Mutex
	next    int64
	waiters map[int64]chan string
}

func newAsks(io *lineIO) *asks {
	return &asks{io: io, waiters: map[int64]chan string{}}
}

// ask emits the line build returns for a fresh id and waits for its
// outcome: nil for a settle line with an empty error, that error
// otherwise, or a timeout error when ctx ends first.
func (a *asks) ask(ctx context.Context, build func(id int64) line) error {
	a.mu.Lock()
	a.next++
	id := a.next
	ch := make(chan string, 1)
	a.waiters[id] = ch
	a.mu.Unlock()
	a.io.emit(build(id))
	select {
	case msg := <-ch:
		if msg != "" {
			return errors.New(msg)
		}
		return nil
	case <-ctx.Done():
		a.mu.Lock()
		delete(a.waiters, id)
		a.mu.Unlock()
		return errors.New("not settled in time")
	}
}

// settle delivers the outcome of ask id; unknown ids are ignored.
func (a *asks) settle(id int64, msg string) {
	a.mu.Lock()
	ch := a.waiters[id]
	delete(a.waiters, id)
	a.mu.Unlock()
	if ch != nil {
		ch <- msg
	}
}

// payer is a directory.Payer whose payments the test settles.
func (a *asks) payer() directory.Payer {
	return directory.PayerFunc(func(ctx context.Context, payee string, atoms int64) error {
		return a.ask(ctx, func(id int64) line {
			return line{Pay: &payLine{ID: id, Payee: payee, Atoms: atoms}}
		})
	})
}

// suggester is a directory.Suggester whose suggestions the test settles.
func (a *asks) suggester() directory.Suggester {
	return directory.SuggesterFunc(func(ctx context.Context, invitee, target string) error {
		return a.ask(ctx, func(id int64) line {
			return line{Suggest: &kxAskLine{ID: id, Invitee: invitee, Target: target}}
		})
	})
}

// introducer is a directory.Introducer whose introductions the test settles.
func (a *asks) introducer() directory.Introducer {
	return directory.IntroducerFunc(func(ctx context.Context, mediator, target string) error {
		return a.ask(ctx, func(id int64) line {
			return line{Introduce: &kxAskLine{ID: id, Mediator: mediator, Target: target}}
		})
	})
}
