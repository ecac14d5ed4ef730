//go:build linux

// Command sandboxio is a TEST FIXTURE standing in for oac-sandbox-io (the
// real one is not part of this repository). It accepts exactly the
// contract's command line (anything else: usage, exit 2), prints what the
// contract promises it (empty environment, uid/gid 1000, no supplementary
// groups, its own session, no-new-privileges, working directory, the
// private file's mode, owner and digest) as "sandbox-io: key=value" lines,
// then waits for SIGTERM or SIGINT and exits 0.
//
// It reads nothing but the file, like the real one. Its behaviour is chosen
// by the link URL's host, a test knob: "crash-loop.*" exits 1 at once (a
// startup failure), "usage.*" exits 2, "relay.*" or an address literal
// connects to the Link
// like the real one (system resolver, system TLS roots, no proxy: its
// environment is empty) and upgrades to a websocket presenting the
// credential as a bearer token, retrying with backoff until the relay
// holds it ("sandbox-io: link=connected status=101"); a 401 is a
// permanent refusal (exit 1). Other hosts make no connection.
package main

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/e2e/internal/standin/selfreport"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

const file = "/home/runtime/sandbox-io-bootstrap.json"

func say(format string, args ...any) { fmt.Printf("sandbox-io: "+format+"\n", args...) }

func main() {
	if len(os.Args) != 3 || os.Args[1] != "--bootstrap-file" || os.Args[2] != file {
		fmt.Fprintln(os.Stderr, "usage: oac-sandbox-io --bootstrap-file "+file)
		os.Exit(2)
	}
	// Signals first: a stop may come at any time.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	say("argv=ok")
	say("env=%d%s", len(os.Environ()), names(os.Environ()))
	groups, _ := os.Getgroups()
	say("ids=uid=%d gid=%d groups=%v", os.Getuid(), os.Getgid(), groups)
	sid, _ := unix.Getsid(0)
	say("session-leader=%v", sid == os.Getpid())
	say("nnp=%s", selfreport.StatusField("NoNewPrivs"))
	say("caps=%s", selfreport.Caps())
	say("interfaces=%s", selfreport.Interfaces())
	wd, _ := os.Getwd()
	say("cwd=%s", wd)
	var st syscall.Stat_t
	if err := syscall.Lstat(file, &st); err != nil {
		say("file-error=%v", err)
		os.Exit(1)
	}
	say("file=mode=%04o type=%s uid=%d gid=%d", st.Mode&0o7777, fileType(st.Mode), st.Uid, st.Gid)
	var dst syscall.Stat_t
	_ = syscall.Lstat("/home/runtime", &dst)
	say("dir=mode=%04o uid=%d gid=%d", dst.Mode&0o7777, dst.Uid, dst.Gid)
	data, err := os.ReadFile(file)
	if err != nil {
		say("file-error=%v", err)
		os.Exit(1)
	}
	sum := sha256.Sum256(data)
	say("file-sha256=%s", hex.EncodeToString(sum[:]))
	doc, err := bootstrap.DecodeSandboxIO(data)
	if err != nil {
		say("file-error=%v", err)
		os.Exit(1)
	}
	say("credential-sha256=%s", bootstrap.CredentialDigest(doc.Credential))
	u, _ := url.Parse(doc.LinkURL)
	switch {
	case strings.HasPrefix(u.Hostname(), "crash-loop."):
		say("startup failure (test knob: crash-loop)")
		os.Exit(1)
	case strings.HasPrefix(u.Hostname(), "usage."):
		fmt.Fprintln(os.Stderr, "usage: oac-sandbox-io --bootstrap-file "+file+" (test knob: usage)")
		os.Exit(2)
	}
	if _, err := netip.ParseAddr(u.Hostname()); err == nil || strings.HasPrefix(u.Hostname(), "relay.") {
		go link(doc.LinkURL, doc.Credential)
	} else {
		say("serving (stand-in: no Link connection)")
	}
	sig := <-sigs
	say("got %s, draining", sig)
	os.Exit(0)
}

// link connects to the Link relay and holds the connection: an HTTPS
// request upgraded to a websocket, the credential as a bearer token.
func link(rawURL, credential string) {
	u, _ := url.Parse(rawURL)
	u.Scheme = "https"
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// No proxy: the environment is empty, and this must not need one.
		// Timeouts on the transport, not the client: a client timeout would
		// also cut the held connection.
		tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12},
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: 10 * time.Second}
		c := &http.Client{Transport: tr}
		req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
		req.Header.Set("Authorization", "Bearer "+credential)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		start := time.Now()
		resp, err := c.Do(req)
		switch {
		case err != nil:
			say("link-error=attempt %d: %v", attempt, err)
		case resp.StatusCode == http.StatusSwitchingProtocols:
			say("link=connected status=%d attempt=%d took=%s", resp.StatusCode, attempt, time.Since(start).Round(time.Millisecond))
			// Held as the serve peer until the relay goes away.
			_, _ = io.Copy(io.Discard, resp.Body)
			say("link=closed")
			backoff = 100 * time.Millisecond
			continue
		case resp.StatusCode == http.StatusUnauthorized:
			say("link=refused status=%d", resp.StatusCode)
			os.Exit(1)
		default:
			say("link-error=status %d", resp.StatusCode)
			resp.Body.Close()
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

func names(env []string) string {
	if len(env) == 0 {
		return ""
	}
	var n []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		n = append(n, k)
	}
	return " names=" + strings.Join(n, ",")
}

func fileType(m uint32) string {
	switch m & syscall.S_IFMT {
	case syscall.S_IFREG:
		return "regular"
	case syscall.S_IFLNK:
		return "symlink"
	}
	return "other"
}
