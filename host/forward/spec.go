package forward

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

// Spec is one forward: where the host listens and the guest port.
type Spec struct {
	// Listen is a loopback TCP address ("127.0.0.1:8080", "[::1]:0"; port
	// 0 picks a free one) or an absolute unix socket path.
	Listen    string
	GuestPort int
}

// MaxSpec bounds the text of a spec.
const MaxSpec = 256

// IsUnix reports whether the spec listens on a unix socket.
func (s Spec) IsUnix() bool { return strings.HasPrefix(s.Listen, "/") }

func (s Spec) String() string { return s.Listen + "=" + strconv.Itoa(s.GuestPort) }

// ParseSpec parses LISTEN=GUESTPORT. The last "=" separates them (a unix
// path may contain "=").
func ParseSpec(s string) (Spec, error) {
	if len(s) > MaxSpec {
		return Spec{}, fmt.Errorf("forward: longer than %d bytes", MaxSpec)
	}
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return Spec{}, errors.New("forward: want LISTEN=GUESTPORT (e.g. 127.0.0.1:8080=4096 or /run/oac/daemon.sock=4096)")
	}
	port, err := parsePort(s[i+1:])
	if err != nil {
		return Spec{}, fmt.Errorf("forward %q: guest port: %w", safe(s), err)
	}
	sp := Spec{Listen: s[:i], GuestPort: port}
	return sp, sp.Validate()
}

// Validate checks the spec's form: a loopback address with a port, or a
// clean absolute unix path short enough for a socket; a guest port 1..65535.
func (s Spec) Validate() error {
	if s.GuestPort < 1 || s.GuestPort > 65535 {
		return fmt.Errorf("forward %q: guest port must be 1..65535", safe(s.Listen))
	}
	if s.Listen == "" {
		return errors.New("forward: empty listen address")
	}
	if strings.ContainsFunc(s.Listen, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return fmt.Errorf("forward %q: control characters or spaces in the listen address", safe(s.Listen))
	}
	if s.IsUnix() {
		if filepath.Clean(s.Listen) != s.Listen {
			return fmt.Errorf("forward %q: the socket path must be clean (no //, . or ..)", safe(s.Listen))
		}
		if len(s.Listen) > sockfile.MaxPath {
			return fmt.Errorf("forward %q: socket path longer than %d bytes", safe(s.Listen), sockfile.MaxPath)
		}
		return nil
	}
	ap, err := netip.ParseAddrPort(s.Listen)
	if err != nil {
		return fmt.Errorf("forward %q: listen on 127.0.0.1:PORT, [::1]:PORT or an absolute unix socket path", safe(s.Listen))
	}
	if !ap.Addr().IsLoopback() || ap.Addr().Zone() != "" {
		return fmt.Errorf("forward %q: only host loopback addresses may listen (the daemon must not be reachable from the network)", safe(s.Listen))
	}
	return nil
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" || s[0] == '0' {
		return 0, errors.New("want a number 1..65535")
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, errors.New("want a number 1..65535")
	}
	return p, nil
}

// safe bounds and sanitizes user text quoted in an error.
func safe(s string) string { return safetext.Clean(s, 64, '?') }
