// Package linkrelay is a TEST FIXTURE standing in for the Link relay that
// oac-sandbox-io connects to (the real one is not part of this
// repository). It accepts a websocket upgrade on the link path from a
// client that presents "Authorization: Bearer <credential>" and checks
// the credential the way hosts do: only its digest (hex SHA-256 of the
// trimmed value) is known to the relay. It holds an accepted connection
// open as the serve peer and counts what it saw; it never logs or keeps
// the credential itself.
package linkrelay

import (
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Path is the link path of the contract's example URL.
const Path = "/api/v1/sandbox-link"

// Relay is an http.Handler; serve it over TLS.
type Relay struct {
	// Digest is the hex SHA-256 of the expected credential.
	Digest string

	mu       sync.Mutex
	accepted int
	refused  int
	peers    []io.Closer
}

// Counts returns how many upgrades were accepted and refused.
func (r *Relay) Counts() (accepted, refused int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.refused
}

// Close drops every held serve peer.
func (r *Relay) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		p.Close()
	}
	r.peers = nil
}

func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != Path {
		fmt.Fprintf(w, "link relay stand-in: %s\n", req.URL.Path)
		return
	}
	token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if !ok || subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(r.Digest)) != 1 {
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
		http.Error(w, "credential refused", http.StatusUnauthorized)
		return
	}
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "websocket upgrade required", http.StatusUpgradeRequired)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	acc := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(acc[:]))
	if err := brw.Flush(); err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.accepted++
	r.peers = append(r.peers, c)
	r.mu.Unlock()
	// Hold the serve peer until it goes away.
	go func() { defer c.Close(); _, _ = io.Copy(io.Discard, brw) }()
}
