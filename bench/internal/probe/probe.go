// Package probe is what the benchmarks run inside a guest and, for the
// direct baselines, on the host: the same clients on both sides. A guest
// runs it as its daemon (bench/internal/netprobe), serving requests on a
// loopback port the host reaches through a forward; the host calls Run in
// its own process. It measures only: it decides nothing about the product.
package probe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request is one measurement.
type Request struct {
	// Cmd: "curl" (run curl with Args; Value is its stdout as a number),
	// "curls" (Flows curls with Args at once; Value is the seconds until
	// all ended), "connect" (N connections to Target, each sending an
	// HTTP request and reading the first byte of the answer; Value is the
	// median in µs), "rtt" (one connection to Target, an echo server, and
	// N 64-byte round trips; Value is the p50 in µs), "get" and "put"
	// (Go's HTTP client moving Size bytes from or to URL; Value is MB/s),
	// "gets" (Flows gets at once; Value is the summed MB/s), "ping".
	Cmd  string   `json:"cmd"`
	Args []string `json:"args,omitempty"`
	// Proxy, when set, is an HTTP proxy (host:port) every connection goes
	// through with CONNECT; otherwise Target is dialed as it is (a name a
	// guest's capture carries, or the host's address).
	Proxy  string `json:"proxy,omitempty"`
	Target string `json:"target,omitempty"`
	URL    string `json:"url,omitempty"`
	N      int    `json:"n,omitempty"`
	Size   int64  `json:"size,omitempty"`
	Flows  int    `json:"flows,omitempty"`
	// Stdin is how many bytes curl gets on its standard input.
	Stdin int64 `json:"stdin,omitempty"`
}

// Result is a measurement's outcome.
type Result struct {
	Value float64 `json:"value"`
	// CPU is the CPU seconds (user and system) curl itself used, for
	// "curl".
	CPU float64 `json:"cpu_s,omitempty"`
	Err string  `json:"err,omitempty"`
}

// Run measures req in this process.
func Run(req Request) Result {
	if req.Cmd == "curl" {
		out, cpu, err := curl(req.Args, req.Stdin)
		if err != nil {
			return Result{Err: err.Error()}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			return Result{Err: err.Error()}
		}
		return Result{Value: v, CPU: cpu}
	}
	v, err := run(req)
	if err != nil {
		return Result{Err: err.Error()}
	}
	return Result{Value: v}
}

func run(req Request) (float64, error) {
	switch req.Cmd {
	case "ping":
		return 1, nil
	case "curls":
		start := time.Now()
		errs := make([]error, req.Flows)
		var wg sync.WaitGroup
		for i := range req.Flows {
			wg.Add(1)
			go func() { defer wg.Done(); _, _, errs[i] = curl(req.Args, req.Stdin) }()
		}
		wg.Wait()
		return time.Since(start).Seconds(), errors.Join(errs...)
	case "connect":
		return connectFirstByte(req)
	case "rtt":
		return roundTrips(req)
	case "get", "put":
		return transfer(req)
	case "gets":
		rates := make([]float64, req.Flows)
		errs := make([]error, req.Flows)
		var wg sync.WaitGroup
		for i := range req.Flows {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req
				r.Cmd, r.Size = "get", req.Size/int64(req.Flows)
				rates[i], errs[i] = transfer(r)
			}()
		}
		wg.Wait()
		sum := 0.0
		for _, r := range rates {
			sum += r
		}
		return sum, errors.Join(errs...)
	}
	return 0, fmt.Errorf("unknown command %q", req.Cmd)
}

// zeros feeds curl's standard input.
var zeros = make([]byte, 1<<20)

// curl runs curl and returns its output and the CPU seconds it used.
func curl(args []string, stdin int64) (string, float64, error) {
	cmd := exec.Command("curl", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin > 0 {
		w, err := cmd.StdinPipe()
		if err != nil {
			return "", 0, err
		}
		go func() {
			defer w.Close()
			for left := stdin; left > 0; {
				n, err := w.Write(zeros[:min(int64(len(zeros)), left)])
				if err != nil {
					return
				}
				left -= int64(n)
			}
		}()
	}
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(), nil
}

// dial reaches target directly or through the proxy's CONNECT.
func dial(proxy, target string) (net.Conn, error) {
	if proxy == "" {
		return net.Dial("tcp", target)
	}
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		c.Close()
		return nil, err
	}
	// The proxy says nothing after its answer until the target does, and
	// the target waits for the client: a buffered read takes the head only.
	br := bufio.NewReaderSize(c, 4096)
	status, err := br.ReadString('\n')
	for err == nil {
		var line string
		if line, err = br.ReadString('\n'); line == "\r\n" {
			break
		}
	}
	if err != nil || br.Buffered() > 0 || !strings.HasPrefix(status, "HTTP/1.1 200") {
		c.Close()
		return nil, fmt.Errorf("CONNECT %s: %q: %v", target, strings.TrimSpace(status), err)
	}
	return c, nil
}

// resolved returns target with its host resolved once, so that the
// timings leave the lookup out (a guest's capture maps its made-up
// address back to the name).
func resolved(proxy, target string) (string, error) {
	if proxy != "" {
		return target, nil
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return "", err
	}
	addrs, err := net.DefaultResolver.LookupHost(context.Background(), host)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(addrs[0], port), nil
}

func connectFirstByte(req Request) (float64, error) {
	target, err := resolved(req.Proxy, req.Target)
	if err != nil {
		return 0, err
	}
	var ds []float64
	b := make([]byte, 1)
	for range req.N {
		start := time.Now()
		c, err := dial(req.Proxy, target)
		if err != nil {
			return 0, err
		}
		_, err = io.WriteString(c, "GET /dl/1 HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
		if err == nil {
			_, err = io.ReadFull(c, b)
		}
		ds = append(ds, float64(time.Since(start).Microseconds()))
		c.Close()
		if err != nil {
			return 0, err
		}
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

func roundTrips(req Request) (float64, error) {
	target, err := resolved(req.Proxy, req.Target)
	if err != nil {
		return 0, err
	}
	c, err := dial(req.Proxy, target)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	msg := bytes.Repeat([]byte{'r'}, 64)
	got := make([]byte, 64)
	ds := make([]float64, 0, req.N)
	for range req.N {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, got); err != nil {
			return 0, err
		}
		ds = append(ds, float64(time.Since(start).Nanoseconds())/1e3)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// transfer is Go's HTTP client: a GET of Size bytes or a PUT of Size
// bytes, in MB/s.
func transfer(req Request) (float64, error) {
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	if req.Proxy != "" {
		// A CONNECT tunnel, as curl --proxytunnel makes one.
		tr.DialContext = func(_ context.Context, _, addr string) (net.Conn, error) { return dial(req.Proxy, addr) }
	}
	cl := &http.Client{Transport: tr}
	start := time.Now()
	var resp *http.Response
	var err error
	if req.Cmd == "put" {
		body := io.LimitReader(zeroReader{}, req.Size)
		r, _ := http.NewRequest(http.MethodPut, req.URL, body)
		r.ContentLength = req.Size
		resp, err = cl.Do(r)
	} else {
		resp, err = cl.Get(req.URL)
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.CopyBuffer(io.Discard, resp.Body, make([]byte, 256<<10))
	if err != nil {
		return 0, err
	}
	if req.Cmd == "get" && n != req.Size {
		return 0, fmt.Errorf("got %d of %d bytes", n, req.Size)
	}
	return float64(req.Size) / time.Since(start).Seconds() / 1e6, nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Serve answers requests on addr, one JSON line each way, until the
// listener fails.
func Serve(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			enc := json.NewEncoder(c)
			for sc.Scan() {
				var req Request
				res := Result{Err: "bad request"}
				if json.Unmarshal(sc.Bytes(), &req) == nil {
					res = Run(req)
				}
				if enc.Encode(res) != nil {
					return
				}
			}
		}()
	}
}

// Client talks to a probe serving in a guest.
type Client struct {
	c  net.Conn
	sc *bufio.Scanner
}

// Dial connects to a probe (through a forward).
func Dial(addr string) (*Client, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Client{c: c, sc: bufio.NewScanner(c)}, nil
}

// Run measures req in the guest.
func (cl *Client) Run(req Request) (float64, error) {
	res, err := cl.RunResult(req)
	return res.Value, err
}

// RunResult is Run, with the whole result (curl's CPU seconds too).
func (cl *Client) RunResult(req Request) (Result, error) {
	if err := json.NewEncoder(cl.c).Encode(req); err != nil {
		return Result{}, err
	}
	if !cl.sc.Scan() {
		return Result{}, fmt.Errorf("probe: no answer: %v", cl.sc.Err())
	}
	var res Result
	if err := json.Unmarshal(cl.sc.Bytes(), &res); err != nil {
		return Result{}, err
	}
	if res.Err != "" {
		return Result{}, errors.New(res.Err)
	}
	return res, nil
}

// Close ends the connection.
func (cl *Client) Close() error { return cl.c.Close() }
