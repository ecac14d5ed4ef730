// Command daemon is a TEST FIXTURE standing in for the product's daemon
// (the real one is not part of this repository). It serves GET
// /global/health behind HTTP Basic auth with the credentials from
// OAC_SERVER_USERNAME and OAC_SERVER_PASSWORD, and prints what the boot
// contract promises it as "daemon: key=value" lines (never the password,
// only its SHA-256).
//
//	daemon serve --hostname 127.0.0.1 --port 4096 [--healthy-after-requests N] [--never-healthy] [--marker X]
//	             [--probe NAME=proxy:URL|direct:URL|dial:HOST:PORT|echo-proxy:HOST:PORT|echo-direct:HOST:PORT|why:HOST:PORT|reach:HOST:PORT]... [--persist PATH]...
//
// Until N authenticated health requests arrived it answers 503 (so a test
// can see that ready waits for health); with --never-healthy always 503.
// SIGTERM or SIGINT: it exits 0.
//
// It also prints its capabilities, no-new-privileges, the network
// interfaces it sees and whether it could read oac-sandbox-io's private
// file (read-private-file=ok, or the errno's name), the doors to the host
// it finds (doors=none, or the findings of selfreport.Doors joined by
// "; "; doors-scan= what that cost), and, once listening, runs each probe: a GET of URL
// through the proxy its environment names (proxy:), a GET with no proxy
// at all (direct:, so only the transparent capture can carry it), or a TCP
// connection that sends a line and reads one back (dial:). Each prints
// "daemon: probe NAME=ok STATUS BODY" or "daemon: probe NAME=error ERROR".
// echo-proxy: (a CONNECT tunnel through the proxy its environment names)
// and echo-direct: (a plain connection, so the capture carries it) send
// EchoBytes of a fixed pattern to an echo server, half-close and read
// everything back: "ok echoed N bytes sha256=HEX" when what came back is
// what was sent. why: (a raw TCP connection the policy refuses) waits for
// the server to speak, expects a reset, and asks the guest why ($OAC_EGRESS_REFUSALS
// with its own source port): "ok reset=ERRNO port=N kind=K code=C
// target=T rule=R reason=REASON". reach: (a plain connection) tries to
// list the interfaces of its socket's namespace, bind the socket to one
// and disconnect it: "ok ifconf=R bindtodevice=R disconnect=R", each R
// "ok" or an errno's name.
//
// Each --persist PATH (a kept sandbox's test) prints "daemon: persist
// PATH=CONTENT" (what an earlier run wrote, or "absent"), then writes
// "kept" there (making the parent directories) and prints "daemon:
// persisted PATH=ok" or "=error ERROR".
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/e2e/internal/standin/selfreport"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// errName names the outcome of a file access: ok, or the errno's name.
func errName(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return errnoName(errno)
	}
	return err.Error()
}

func say(format string, args ...any) { fmt.Printf("daemon: "+format+"\n", args...) }

func main() {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: daemon serve --hostname H --port P [--healthy-after-requests N] [--never-healthy]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	host := fs.String("hostname", "127.0.0.1", "listen host")
	port := fs.String("port", "4096", "listen port")
	after := fs.Int64("healthy-after-requests", 1, "answer 200 from this authenticated request on")
	never := fs.Bool("never-healthy", false, "always answer 503")
	_ = fs.String("marker", "", "ignored: lets tests find this process on the host")
	var probes probeList
	fs.Var(&probes, "probe", "NAME=proxy:URL, NAME=direct:URL, NAME=dial:HOST:PORT, NAME=echo-proxy:HOST:PORT or NAME=echo-direct:HOST:PORT (repeatable)")
	var probes6 probe6List
	fs.Var(&probes6, "probe6", "NAME=URL: a GET with no proxy over IPv6 only (repeatable)")
	var persist stringList
	fs.Var(&persist, "persist", "report the content of PATH, then write \"kept\" there (repeatable)")
	_ = fs.Parse(os.Args[2:])
	for _, p := range persist {
		b, err := os.ReadFile(p)
		switch {
		case err == nil:
			say("persist %s=%s", p, strings.TrimSpace(string(b)))
		case os.IsNotExist(err):
			say("persist %s=absent", p)
		default:
			say("persist %s=error %v", p, err)
		}
		err = os.MkdirAll(filepath.Dir(p), 0o755)
		if err == nil {
			err = os.WriteFile(p, []byte("kept\n"), 0o644)
		}
		if err != nil {
			say("persisted %s=error %v", p, err)
		} else {
			say("persisted %s=ok", p)
		}
	}

	user, pass := os.Getenv("OAC_SERVER_USERNAME"), os.Getenv("OAC_SERVER_PASSWORD")
	if user == "" || pass == "" {
		fmt.Fprintln(os.Stderr, "daemon: OAC_SERVER_USERNAME and OAC_SERVER_PASSWORD must be set")
		os.Exit(1)
	}
	groups, _ := os.Getgroups()
	say("ids=uid=%d gid=%d groups=%v", os.Getuid(), os.Getgid(), groups)
	sum := sha256.Sum256([]byte(pass))
	say("password-sha256=%s", hex.EncodeToString(sum[:]))
	say("password-in-argv=%v", strings.Contains(strings.Join(os.Args, " "), pass))
	var keys []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		keys = append(keys, k)
	}
	sort.Strings(keys)
	say("env-names=%s", strings.Join(keys, ","))
	say("nnp=%s", selfreport.StatusField("NoNewPrivs"))
	say("caps=%s", selfreport.Caps())
	say("interfaces=%s", selfreport.Interfaces())
	// oac-sandbox-io's private file, which no daemon may read.
	_, err := os.ReadFile(bootstrap.SandboxIOFile)
	say("read-private-file=%s", errName(err))
	// Every door to the host the platform left open, as the workload.
	doors := selfreport.ScanDoors()
	say("doors=%s", selfreport.Report(doors.Findings))
	scan := fmt.Sprintf("took %s, %d entries", doors.Took.Round(10*time.Microsecond), doors.Entries)
	if len(doors.Truncated) > 0 {
		scan += ", bounded in " + strings.Join(doors.Truncated, ",")
	}
	if len(doors.Stages) > 0 {
		scan += " (" + strings.Join(doors.Stages, ", ") + ")"
	}
	if len(doors.Closed) > 0 {
		scan += "; there but closed: " + strings.Join(doors.Closed, ", ")
	}
	say("doors-scan=%s", scan)

	var n atomic.Int64
	var denied atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /global/health", func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			if !denied.Swap(true) {
				say("health=401 (wrong or missing credentials)")
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		c := n.Add(1)
		if *never || c < *after {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if c == *after {
			say("health=200 after %d authenticated request(s)", c)
		}
		_, _ = w.Write([]byte(`{"healthy":true}`))
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, *port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "daemon:", err)
		os.Exit(1)
	}
	say("listening=%s", ln.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { _ = http.Serve(ln, mux) }()
	for _, p := range probes {
		go p.run()
	}
	for _, p := range probes6 {
		go p.run6()
	}
	sig := <-sigs
	say("got %s, exiting", sig)
	os.Exit(0)
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// probe is one --probe.
type probe struct{ name, mode, target string }

type probeList []probe

func (l *probeList) String() string { return "" }

func (l *probeList) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	mode, target, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || (mode != "proxy" && mode != "direct" && mode != "dial" && mode != "echo-proxy" && mode != "echo-direct" && mode != "why" && mode != "reach") {
		return fmt.Errorf("--probe %q: want NAME=proxy:URL, NAME=direct:URL or NAME=dial:HOST:PORT", v)
	}
	*l = append(*l, probe{name, mode, target})
	return nil
}

const probeTimeout = 10 * time.Second

// EchoBytes is how much an echo probe sends (and reads back).
const EchoBytes = 1 << 20

// EchoPattern is what an echo probe sends.
func EchoPattern() []byte {
	b := make([]byte, EchoBytes)
	for i := range b {
		b[i] = byte(i*31 + i>>11)
	}
	return b
}

// echo runs an echo probe over c, whose first bytes may already be in br.
func echo(c net.Conn, br *bufio.Reader) (string, error) {
	want := EchoPattern()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		if cw, ok := c.(interface{ CloseWrite() error }); ok && err == nil {
			err = cw.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(io.LimitReader(br, 2*EchoBytes))
	if err != nil {
		return "", err
	}
	if err := <-werr; err != nil {
		return "", err
	}
	sum := sha256.Sum256(got)
	if len(got) != len(want) || string(got) != string(want) {
		return "", fmt.Errorf("echoed %d bytes that differ from the %d sent (sha256=%s)", len(got), len(want), hex.EncodeToString(sum[:]))
	}
	return fmt.Sprintf("echoed %d bytes sha256=%s", len(got), hex.EncodeToString(sum[:])), nil
}

func (p probe) run() {
	result := func(format string, args ...any) { say("probe %s="+format, append([]any{p.name}, args...)...) }
	if p.mode == "echo-proxy" || p.mode == "echo-direct" {
		addr := p.target
		if p.mode == "echo-proxy" {
			u, err := http.ProxyFromEnvironment(&http.Request{URL: &url.URL{Scheme: "https", Host: p.target}})
			if err != nil || u == nil {
				result("error no proxy in the environment: %v", err)
				return
			}
			addr = u.Host
		}
		c, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err != nil {
			result("error %v", err)
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * probeTimeout))
		br := bufio.NewReader(c)
		if p.mode == "echo-proxy" {
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", p.target, p.target)
			resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
			if err != nil {
				result("error CONNECT through %s: %v", addr, err)
				return
			}
			if resp.StatusCode != http.StatusOK {
				result("error CONNECT answered %d", resp.StatusCode)
				return
			}
		}
		out, err := echo(c, br)
		if err != nil {
			result("error %v", err)
			return
		}
		result("ok %s", out)
		return
	}
	if p.mode == "why" || p.mode == "reach" {
		do := why
		if p.mode == "reach" {
			do = reach
		}
		out, err := do(p.target)
		if err != nil {
			result("error %v", err)
			return
		}
		result("ok %s", out)
		return
	}
	if p.mode == "dial" {
		c, err := net.DialTimeout("tcp", p.target, probeTimeout)
		if err != nil {
			result("error %v", err)
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(probeTimeout))
		_, _ = c.Write([]byte("probe\n"))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			result("error %v", err)
			return
		}
		result("ok %s", strings.TrimSpace(line))
		return
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	if p.mode == "proxy" {
		tr.Proxy = http.ProxyFromEnvironment
	}
	getProbe(tr, p.target, result)
}

// getProbe GETs target through tr and reports the status and the
// body's first 200 bytes, or the error.
func getProbe(tr *http.Transport, target string, result func(format string, args ...any)) {
	c := &http.Client{Transport: tr, Timeout: probeTimeout}
	resp, err := c.Get(target)
	if err != nil {
		result("error %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	result("ok %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// why connects to target with no proxy (the capture carries it), expects
// the reset of a refused connection, and asks the guest why, by its own
// source port.
func why(target string) (string, error) {
	// Bound before it connects, so the port is known even when the reset
	// already fails the connect (the refusal is that fast).
	var port int
	d := net.Dialer{Timeout: probeTimeout, Control: func(network, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) { port, err = bindAny(int(fd), network) }); cerr != nil {
			return cerr
		}
		return err
	}}
	n := 0
	c, err := d.Dial("tcp4", target)
	if err == nil {
		// It waits for the server to speak first (ssh, a database): the
		// read is the first to see the reset, which a write before it
		// could take, leaving the read an EOF.
		_ = c.SetDeadline(time.Now().Add(probeTimeout))
		n, err = c.Read(make([]byte, 64))
		c.Close()
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return "", fmt.Errorf("not reset: read %d bytes, %v", n, err)
	}
	where := os.Getenv("OAC_EGRESS_REFUSALS")
	if where == "" {
		return "", errors.New("OAC_EGRESS_REFUSALS is not set")
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: probeTimeout}
	resp, err := hc.Get(fmt.Sprintf("%s?port=%d", where, port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var ans struct {
		Refusals []struct {
			SourcePort int    `json:"source_port"`
			Target     string `json:"target"`
			Kind       string `json:"kind"`
			Code       string `json:"code"`
			Rule       string `json:"rule"`
			Reason     string `json:"reason"`
		} `json:"refusals"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ans); err != nil {
		return "", fmt.Errorf("%s: %d, %v", where, resp.StatusCode, err)
	}
	if len(ans.Refusals) != 1 || ans.Refusals[0].SourcePort != port {
		return "", fmt.Errorf("%s?port=%d: %d refusals, want this connection's one", where, port, len(ans.Refusals))
	}
	r := ans.Refusals[0]
	return fmt.Sprintf("reset=%s port=%d kind=%s code=%s target=%s rule=%s reason=%s", errnoName(errno), port, r.Kind, r.Code, r.Target, r.Rule, r.Reason), nil
}
