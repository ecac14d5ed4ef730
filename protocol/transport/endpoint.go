package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// Schemes understood by Parse.
const (
	SchemeUnix   = "unix"
	SchemeVsock  = "vsock"
	SchemeStdio  = "stdio"
	SchemeSerial = "serial"
	// SchemeUnixListen is the one endpoint the guest listens on instead
	// of dialing: it takes the first connection on an owner-only socket
	// and removes the socket, so nobody connects a second time. A Pod's
	// agent waits so for the bridge the host execs into it (see
	// docs/kubernetes.md).
	SchemeUnixListen = "unix+listen"
)

// ErrUnsupported is returned when an endpoint cannot dial on this OS.
var ErrUnsupported = errors.New("transport not supported here")

// Endpoint is a parsed endpoint URL.
type Endpoint struct {
	Scheme string
	Path   string // unix, serial
	CID    uint32 // vsock
	Port   uint32 // vsock
}

// String returns the URL form of e.
func (e Endpoint) String() string {
	switch e.Scheme {
	case SchemeVsock:
		return fmt.Sprintf("vsock://%d:%d", e.CID, e.Port)
	case SchemeStdio:
		return "stdio://"
	case SchemeUnix, SchemeSerial, SchemeUnixListen:
		// Escaped, so that a path holding '%', '?', '#' or control
		// characters prints as a URL that parses back to the same path.
		return (&url.URL{Scheme: e.Scheme, Path: e.Path}).String()
	default:
		return e.Scheme + "://" + e.Path
	}
}

// Parse parses an endpoint URL such as unix:///run/oac.sock or vsock://2:1024.
func Parse(raw string) (Endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", raw, err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: user info, query and fragment are not allowed", raw)
	}
	switch u.Scheme {
	case SchemeUnix, SchemeSerial, SchemeUnixListen:
		if u.Host != "" || !path.IsAbs(u.Path) || path.Clean(u.Path) != u.Path {
			return Endpoint{}, fmt.Errorf("endpoint %q: want %s:///absolute/clean/path", raw, u.Scheme)
		}
		return Endpoint{Scheme: u.Scheme, Path: u.Path}, nil
	case SchemeStdio:
		if u.Host != "" || u.Opaque != "" || (u.Path != "" && u.Path != "/") {
			return Endpoint{}, fmt.Errorf("endpoint %q: stdio takes no address, write stdio://", raw)
		}
		return Endpoint{Scheme: SchemeStdio}, nil
	case SchemeVsock:
		host, port, ok := strings.Cut(u.Host, ":")
		if !ok || (u.Path != "" && u.Path != "/") {
			return Endpoint{}, fmt.Errorf("endpoint %q: want vsock://CID:PORT", raw)
		}
		cid, err1 := strconv.ParseUint(host, 10, 32)
		p, err2 := strconv.ParseUint(port, 10, 32)
		if err1 != nil || err2 != nil {
			return Endpoint{}, fmt.Errorf("endpoint %q: CID and port must be decimal 32-bit numbers", raw)
		}
		return Endpoint{Scheme: SchemeVsock, CID: uint32(cid), Port: uint32(p)}, nil
	default:
		return Endpoint{}, fmt.Errorf("endpoint %q: unknown scheme %q (want unix, unix+listen, vsock, stdio or serial)", raw, u.Scheme)
	}
}

// Dial connects to e.
func (e Endpoint) Dial(ctx context.Context) (net.Conn, error) {
	switch e.Scheme {
	case SchemeUnix:
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", e.Path)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", e, err)
		}
		return c, nil
	case SchemeUnixListen:
		return listenOnce(ctx, e.Path)
	case SchemeStdio:
		return Stdio(), nil
	case SchemeSerial:
		return dialSerial(e.Path)
	case SchemeVsock:
		return dialVsock(ctx, e.CID, e.Port)
	}
	return nil, fmt.Errorf("dial %s: %w", e, ErrUnsupported)
}
