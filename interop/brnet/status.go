package main

// The status server of a brmcp host, as brclientd serves it: one endpoint,
// POST /contacts/suggest-kx with the JSON body {"invitee": "<hex uid>",
// "target": "<hex uid>"}, which has this user's client send invitee a
// suggestion to KX with target (the client library's SuggestKX; clientrpc has
// no method for it). It listens on its own port with the clientrpc mutual
// TLS. brclientd's sources are not public, so the refusals are brnet's own
// (brmcp/testing/fakebr/_status.py uses the same): 204 on success, 405 for
// another method, 400 for a body or uid that does not parse, 404
// "user <uid> not found" when invitee or target is not a contact, 500 for
// any other failure.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/companyzero/bisonrelay/client"
	"github.com/companyzero/bisonrelay/zkidentity"
	"github.com/decred/slog"
)

func newStatusServer(c *client.Client, log slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/contacts/suggest-kx", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var body struct {
			Invitee *string `json:"invitee"`
			Target  *string `json:"target"`
		}
		raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err == nil {
			err = json.Unmarshal(raw, &body)
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("invalid request body: %v", err), http.StatusBadRequest)
			return
		}
		if body.Invitee == nil || body.Target == nil {
			http.Error(w, `invalid request body: want {"invitee": "<hex>", "target": "<hex>"}`, http.StatusBadRequest)
			return
		}
		var invitee, target zkidentity.ShortID
		if err := invitee.FromString(*body.Invitee); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := target.FromString(*body.Target); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, id := range []zkidentity.ShortID{invitee, target} {
			if !c.UserExists(id) {
				http.Error(w, fmt.Sprintf("user %s not found", id), http.StatusNotFound)
				return
			}
		}
		if err := c.SuggestKX(invitee, target); err != nil {
			log.Warnf("SuggestKX(%s, %s): %v", invitee, target, err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// serveStatus serves srv on lis until ctx ends.
func serveStatus(ctx context.Context, srv *http.Server, lis net.Listener) {
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = lis.Close()
	}
}
