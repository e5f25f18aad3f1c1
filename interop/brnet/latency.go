package main

// delayedConn adds a fixed delay to every write a client makes to the relay,
// preserving order: a message from one user reaches the relay (and so the
// other user) that much later. Writes return at once, as on a real network.

import (
	"net"
	"sync"
	"time"
)

type delayedChunk struct {
	due  time.Time
	data []byte
}

type delayedConn struct {
	net.Conn
	delay time.Duration
	queue chan delayedChunk
	mtx   sync.Mutex
	err   error
	done  chan struct{}
	once  sync.Once
}

func newDelayedConn(c net.Conn, delay time.Duration) *delayedConn {
	dc := &delayedConn{Conn: c, delay: delay, queue: make(chan delayedChunk, 4096),
		done: make(chan struct{})}
	go dc.run()
	return dc
}

func (dc *delayedConn) run() {
	for {
		select {
		case <-dc.done:
			return
		case ch := <-dc.queue:
			if d := time.Until(ch.due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-dc.done:
					t.Stop()
					return
				}
			}
			if _, err := dc.Conn.Write(ch.data); err != nil {
				dc.mtx.Lock()
				dc.err = err
				dc.mtx.Unlock()
				return
			}
		}
	}
}

func (dc *delayedConn) Write(p []byte) (int, error) {
	dc.mtx.Lock()
	err := dc.err
	dc.mtx.Unlock()
	if err != nil {
		return 0, err
	}
	b := make([]byte, len(p))
	copy(b, p)
	select {
	case dc.queue <- delayedChunk{due: time.Now().Add(dc.delay), data: b}:
		return len(p), nil
	case <-dc.done:
		return 0, net.ErrClosed
	}
}

func (dc *delayedConn) Close() error {
	dc.once.Do(func() { close(dc.done) })
	return dc.Conn.Close()
}
