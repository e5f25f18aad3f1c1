package main

// The control endpoint (HTTP on 127.0.0.1 only):
//
//	GET  /status               every user's running/online/connected state
//	POST /offline/<nick>       disconnect the user from the relay and keep it off
//	POST /online/<nick>        let it reconnect (after brclient's reconnect delay)
//	POST /restart/<nick>       stop the user's client and clientrpc server and
//	                           start them again on the same root and port
//	                           (a brclient restart; ?downms=N waits N ms between)
//
// Replies are JSON; errors are {"error": "..."} with status 400/404/500.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func (nw *network) startControl(ctx context.Context) (net.Listener, error) {
	lis, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", nw.st.ControlPort))
	if err != nil {
		return nil, fmt.Errorf("control endpoint: %w", err)
	}
	nw.control = "http://" + lis.Addr().String()
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		var users []map[string]any
		for _, n := range nw.nodes {
			users = append(users, n.status())
		}
		reply(w, 200, map[string]any{"users": users})
	})
	action := func(name string, f func(n *node, r *http.Request) error) {
		mux.HandleFunc("/"+name+"/", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				reply(w, 405, map[string]string{"error": "use POST"})
				return
			}
			nick := strings.TrimPrefix(r.URL.Path, "/"+name+"/")
			n := nw.byNick[nick]
			if n == nil {
				reply(w, 404, map[string]string{"error": "unknown user " + strconv.Quote(nick)})
				return
			}
			if err := f(n, r); err != nil {
				reply(w, 500, map[string]string{"error": err.Error()})
				return
			}
			reply(w, 200, n.status())
		})
	}
	action("offline", func(n *node, _ *http.Request) error { return n.setOnline(false) })
	action("online", func(n *node, _ *http.Request) error { return n.setOnline(true) })
	action("restart", func(n *node, r *http.Request) error {
		n.stop()
		if ms, err := strconv.Atoi(r.URL.Query().Get("downms")); err == nil && ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		if err := n.start(ctx); err != nil {
			return err
		}
		return n.waitConnected(30 * time.Second)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return lis, nil
}
