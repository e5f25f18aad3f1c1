package main

// The control endpoint (HTTP on 127.0.0.1 only):
//
//	GET  /status               every user's running/online/connected state
//	POST /offline/<nick>       disconnect the user from the relay and keep it off
//	POST /online/<nick>        let it reconnect (after brclient's reconnect delay)
//	POST /restart/<nick>       stop the user's client and clientrpc server and
//	                           start them again on the same root and port
//	                           (a brclient restart; ?downms=N waits N ms between)
//	POST /newgc/<nick>?name=   create a GC (clientrpc has no method for it)
//	POST /post/<nick>?text=    publish a post to the user's subscribers
//	POST /comment/<nick>?from=&pid=&text=
//	                           comment on post pid (hex) received from uid from
//	POST /kx/<nick>?with=<nick>
//	                           KX the two users now (an invite, as at start)
//	POST /fetch/<nick>?uid=&path=
//	                           request a resource (path a/b/c) from uid; it
//	                           reaches that user's ResourcesService.RequestsStream
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

	"github.com/companyzero/bisonrelay/zkidentity"
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
	// Actions clientrpc has no method for (so tests can make real GC and post
	// events): create a GC named ?name=, publish a post with body ?text=.
	action("newgc", func(n *node, r *http.Request) error {
		_, err := n.c.NewGroupChat(r.URL.Query().Get("name"))
		return err
	})
	action("post", func(n *node, r *http.Request) error {
		_, err := n.c.CreatePost(r.URL.Query().Get("text"), "")
		return err
	})
	// Comment ?text= on the post ?pid= (hex) received from ?from= (hex uid).
	action("comment", func(n *node, r *http.Request) error {
		q := r.URL.Query()
		var from, pid zkidentity.ShortID
		if err := from.FromString(q.Get("from")); err != nil {
			return fmt.Errorf("from: %w", err)
		}
		if err := pid.FromString(q.Get("pid")); err != nil {
			return fmt.Errorf("pid: %w", err)
		}
		_, err := n.c.CommentPost(from, pid, q.Get("text"), nil)
		return err
	})
	// KX with the user ?with= (a nick) now, as -kx does at start.
	action("kx", func(n *node, r *http.Request) error {
		with := r.URL.Query().Get("with")
		other := nw.byNick[with]
		if other == nil || other == n {
			return fmt.Errorf("with: %q is not another user of this brnet", with)
		}
		return kxPairs([][2]*node{{n, other}}, 60*time.Second)
	})
	// Fetch the resource at ?path= (slash-separated) from ?uid= (hex).
	action("fetch", func(n *node, r *http.Request) error {
		var uid zkidentity.ShortID
		if err := uid.FromString(r.URL.Query().Get("uid")); err != nil {
			return fmt.Errorf("uid: %w", err)
		}
		path := strings.Split(r.URL.Query().Get("path"), "/")
		_, err := n.c.FetchResource(uid, path, nil, 0, 0, nil)
		return err
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return lis, nil
}
