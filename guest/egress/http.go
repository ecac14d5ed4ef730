package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/protocol"
)

// Errors from parseRequest.
var (
	errHeaderTooLarge = errors.New("request head larger than 64 KiB")
	errNotProxy       = errors.New("this is the sandbox's egress proxy: send absolute-form http:// requests or CONNECT host:port")
	errHTTPS          = errors.New("absolute-form https:// is not supported: use CONNECT host:443 (set HTTPS_PROXY)")
	errBadTarget      = errors.New("the request Target is not host:port with a port in 1..65535")
)

// limitedReader is io.LimitedReader whose limit is reset per request head.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// parseRequest reads one request head from br and returns the request and
// its target. The caller bounds br's source with a limitedReader.
func parseRequest(br *bufio.Reader) (*http.Request, Target, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		if errors.Is(err, errHeaderTooLarge) {
			return nil, Target{}, errHeaderTooLarge
		}
		return nil, Target{}, err
	}
	t, err := requestTarget(req)
	return req, t, err
}

// requestTarget extracts the target of a proxy request: the authority of
// a CONNECT, the host of an absolute-form http:// URL (port 80 default).
func requestTarget(req *http.Request) (Target, error) {
	var host, port string
	if req.Method == http.MethodConnect {
		var err error
		if host, port, err = net.SplitHostPort(req.RequestURI); err != nil {
			return Target{}, errBadTarget
		}
	} else {
		if req.URL == nil || !req.URL.IsAbs() || req.URL.Host == "" {
			return Target{}, errNotProxy
		}
		switch req.URL.Scheme {
		case "http":
		case "https":
			return Target{}, errHTTPS
		default:
			return Target{}, errNotProxy
		}
		if req.URL.User != nil {
			return Target{}, errBadTarget
		}
		host, port = req.URL.Hostname(), req.URL.Port()
		if port == "" {
			port = "80"
		}
	}
	if host == "" {
		return Target{}, errBadTarget
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return Target{}, errBadTarget
	}
	h := protocol.StreamHeader{Kind: protocol.KindEgress, Host: host, Port: p}
	if h.Validate() != nil {
		return Target{}, errBadTarget
	}
	return Target{Host: host, Port: p}, nil
}

// bufConn reads what a bufio.Reader already holds before reading the
// connection again.
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) {
	if b.br != nil && b.br.Buffered() > 0 {
		return b.br.Read(p)
	}
	return b.Conn.Read(p)
}

// CloseWrite half-closes the underlying connection when it can.
func (b *bufConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return b.Conn.Close()
}

// upstream is an open egress stream for absolute-form requests.
type upstream struct {
	t  Target
	c  net.Conn
	br *bufio.Reader
}

func (p *Proxies) serveHTTP(c net.Conn) {
	lr := &limitedReader{r: c}
	br := bufio.NewReaderSize(lr, 16<<10)
	var up *upstream
	defer func() {
		if up != nil {
			up.c.Close()
		}
	}()
	for first := true; ; first = false {
		lr.n = MaxHeaderBytes
		wait := HeaderTimeout
		if !first {
			wait = KeepAliveIdle
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		req, t, err := parseRequest(br)
		_ = c.SetReadDeadline(time.Time{})
		lr.n = math.MaxInt64
		if req != nil && p.isRefusalsRequest(req) {
			p.serveRefusals(c, req)
			return
		}
		if err != nil {
			if req == nil && (errors.Is(err, io.EOF) || first == false && isTimeout(err)) {
				return
			}
			status := http.StatusBadRequest
			if errors.Is(err, errHeaderTooLarge) {
				status = http.StatusRequestHeaderFieldsTooLarge
			} else if isTimeout(err) {
				status = http.StatusRequestTimeout
			}
			writeLocalError(c, status, err)
			return
		}
		if req.Method == http.MethodConnect {
			p.tunnel(c, br, t)
			return
		}
		if first && p.exit.hands() {
			// The first request may be handed; when it is not, the
			// connection it opened carries it as a stream.
			st, r := p.exit.Attempt(p.ctx, c, t.Host, t.Port, protocol.ViaHTTP).Go(true, nil, originFormHead(br, req))
			if !r.OK() {
				writeRefusal(c, t, r)
				return
			}
			if st == nil {
				return // handed: the host carries it
			}
			up = &upstream{t: t, c: st, br: bufio.NewReaderSize(st, 16<<10)}
		}
		var ok bool
		if up, ok = p.forward(c, br, req, t, up); !ok {
			return
		}
	}
}

// connectOK is the answer to a CONNECT the host allowed.
const connectOK = "HTTP/1.1 200 Connection established\r\n\r\n"

// tunnel answers a CONNECT and carries bytes both ways once the host said
// yes.
func (p *Proxies) tunnel(c net.Conn, br *bufio.Reader, t Target) {
	var early []byte
	if n := br.Buffered(); n > 0 {
		early, _ = br.Peek(n)
	}
	p.exit.Attempt(p.ctx, c, t.Host, t.Port, protocol.ViaConnect).Carry([]byte(connectOK), early, func(r protocol.EgressReply) {
		writeRefusal(c, t, r)
	})
}

// originFormHead is what a handed absolute-form request sends the
// upstream first: its head in origin form (RFC 9112 3.2.1), as tunnel
// does with a CONNECT, followed by what the client sent after it. The
// host connects, writes it, and the body and the response then flow
// between the workload and the upstream with no relay in the guest. The
// head says "Connection: close" (unless it upgrades): a client may send
// its next request on this connection for another target, so the
// connection carries this one only. Over protocol.MaxHandEarly (with the
// buffered body) it is not handed: the request then goes as a stream.
func originFormHead(br *bufio.Reader, req *http.Request) []byte {
	h := req.Header.Clone()
	upgrade := removeHopByHop(h)
	if upgrade != "" {
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", upgrade)
	} else {
		h.Set("Connection", "close")
	}
	// The body's framing as the client sent it (the parser moved it out of
	// the header): its bytes follow the head unchanged.
	switch {
	case len(req.TransferEncoding) > 0:
		h.Set("Transfer-Encoding", strings.Join(req.TransferEncoding, ", "))
		h.Del("Content-Length")
	case req.ContentLength > 0:
		h.Set("Content-Length", strconv.FormatInt(req.ContentLength, 10))
	default:
		h.Del("Content-Length")
	}
	h.Del("Host")
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", req.Method, req.URL.RequestURI(), req.URL.Host)
	_ = h.Write(&b)
	b.WriteString("\r\n")
	early := []byte(b.String())
	if n := br.Buffered(); n > 0 {
		body, _ := br.Peek(n)
		early = append(early, body...)
	}
	return early
}

// hopByHop are headers that describe one connection, not the message.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) (upgrade string) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				if strings.EqualFold(f, "upgrade") {
					upgrade = h.Get("Upgrade")
				}
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	return upgrade
}

// forward sends one absolute-form request over an egress stream for its
// target (reusing up when it is for the same target) and copies the
// response back. It returns the stream to keep and whether the client
// connection may carry another request.
func (p *Proxies) forward(c net.Conn, br *bufio.Reader, req *http.Request, t Target, up *upstream) (*upstream, bool) {
	if up != nil && up.t != t {
		up.c.Close()
		up = nil
	}
	upgrade := removeHopByHop(req.Header)
	if upgrade != "" {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upgrade)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Request.Write adds Go's otherwise
	}
	// RFC 9112 3.2.2: the absolute-form target wins over the Host header.
	req.Host = req.URL.Host
	req.RequestURI = ""
	continued := false
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		req.Header.Del("Expect")
		continued = true
	}
	bodiless := req.Body == nil || req.Body == http.NoBody
	for attempt := 0; ; attempt++ {
		reused := up != nil
		if up == nil {
			st, r := p.exit.Attempt(p.ctx, c, t.Host, t.Port, protocol.ViaHTTP).Go(false, nil, nil)
			if !r.OK() {
				writeRefusal(c, t, r)
				return nil, false
			}
			up = &upstream{t: t, c: st, br: bufio.NewReaderSize(st, 16<<10)}
		}
		if continued {
			continued = false
			if _, err := io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
				return up, false
			}
		}
		err := req.Write(up.c)
		var resp *http.Response
		if err == nil {
			resp, err = http.ReadResponse(up.br, req)
		}
		if err != nil {
			up.c.Close()
			up = nil
			// A kept-alive stream the upstream closed meanwhile: retry a
			// request without a body once on a fresh stream.
			if reused && bodiless && attempt == 0 {
				continue
			}
			writeLocalError(c, http.StatusBadGateway, fmt.Errorf("%s: no valid response: %v", t, err))
			return nil, false
		}
		return p.relayResponse(c, br, req, resp, up)
	}
}

// relayResponse copies resp (and any interim 1xx responses before it) to
// the client; a 101 turns the connection into a tunnel.
func (p *Proxies) relayResponse(c net.Conn, br *bufio.Reader, req *http.Request, resp *http.Response, up *upstream) (*upstream, bool) {
	for {
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if err := writeHead(c, resp); err != nil {
				return up, false
			}
			if _, _, err := pipe.Join(&bufConn{Conn: c, br: br}, &bufConn{Conn: up.c, br: up.br}, nil); err != nil {
				Abort(up.c)
			}
			return up, false
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			if err := writeHead(c, resp); err != nil {
				return up, false
			}
			var err error
			if resp, err = http.ReadResponse(up.br, req); err != nil {
				return up, false
			}
			continue
		}
		removeHopByHop(resp.Header)
		// When the client is gone, Response.Write closes the body, which
		// reads the rest of the response (to the end of an endless one):
		// the stream is aborted first, on the failed write.
		err := resp.Write(abortOnError{w: c, stream: up.c})
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return up, false
		}
		return up, true
	}
}

// writeHead writes a response's status line and headers only.
func writeHead(w io.Writer, resp *http.Response) error {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/%d.%d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.Status)
	_ = resp.Header.Write(&b)
	b.WriteString("\r\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func writeLocalError(w io.Writer, status int, err error) {
	body := fmt.Sprintf("sandbox egress proxy: %s\n", sanitize(err.Error()))
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Sandbox-Egress: error\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// refusalStatus maps a failure code to the HTTP status the proxy answers.
func refusalStatus(code protocol.EgressCode) int {
	switch code {
	case protocol.EgressDenied:
		return http.StatusForbidden
	case protocol.EgressInvalidArgument, protocol.EgressUnsupportedNetwork:
		return http.StatusBadRequest
	case protocol.EgressTimedOut:
		return http.StatusGatewayTimeout
	case protocol.EgressResourceExhausted, protocol.EgressCancelled:
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// refusalResponse renders the host's refusal as an HTTP response: 403 with
// X-Sandbox-Egress: denied for policy, another status with
// X-Sandbox-Egress: failed otherwise.
func refusalResponse(t Target, r protocol.EgressReply) string {
	status := refusalStatus(r.Code)
	kind, body := "failed", ""
	switch r.Code {
	case protocol.EgressDenied:
		kind = "denied"
		body = fmt.Sprintf("Blocked by the sandbox's egress policy: this is not a network fault.\n"+
			"The sandbox host refused the connection to %s.\nReason: %s\n", t, r.Reason)
		if r.Rule != "" {
			body += "Rule: " + r.Rule + "\n"
		}
		body += "Retrying will not help: the policy refuses this target every time. " +
			"Use an allowed destination, or ask the operator to allow it (oac-shim run --allow HOST:PORT).\n"
	case protocol.EgressResourceExhausted:
		body = fmt.Sprintf("The sandbox host refused the connection to %s: %s\n"+
			"This is a sandbox limit, not a network fault: retry after other connections have closed.\n", t, r.Reason)
	default:
		body = fmt.Sprintf("The sandbox host could not connect to %s: %s (%s).\n", t, r.Reason, r.Code)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	b.WriteString("X-Sandbox-Egress: " + kind + "\r\n")
	fmt.Fprintf(&b, "X-Sandbox-Egress-Code: %d %s\r\n", int(r.Code), r.Code)
	b.WriteString("X-Sandbox-Egress-Effect: " + r.Effect + "\r\n")
	b.WriteString("X-Sandbox-Egress-Reason: " + sanitize(r.Reason) + "\r\n")
	if r.Rule != "" {
		b.WriteString("X-Sandbox-Egress-Rule: " + sanitize(r.Rule) + "\r\n")
	}
	b.WriteString("Cache-Control: no-store\r\nConnection: close\r\n")
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.String()
}

// RefusalResponse is the proxy's HTTP response to the host's refusal of
// host:port, for another path that answers HTTP clients the same way (a
// captured connection to port 80).
func RefusalResponse(host string, port int, r protocol.EgressReply) string {
	return refusalResponse(Target{Host: host, Port: port}, r)
}

func writeRefusal(w io.Writer, t Target, r protocol.EgressReply) {
	_, _ = io.WriteString(w, refusalResponse(t, r))
}

// abortOnError writes to w and aborts stream (egress.Abort) when a write
// fails.
type abortOnError struct {
	w      io.Writer
	stream net.Conn
}

func (a abortOnError) Write(p []byte) (int, error) {
	n, err := a.w.Write(p)
	if err != nil {
		Abort(a.stream)
	}
	return n, err
}
