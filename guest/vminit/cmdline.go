package vminit

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/protocol/transport"
	"github.com/oac/sandbox-agent/protocol/vmparams"
)

// Defaults and bounds.
const (
	DefaultHostGrace = 30 * time.Second
	MinHostGrace     = time.Second
	MaxHostGrace     = time.Hour
	// MaxCmdline bounds the command line accepted (x86 allows 2 KiB;
	// other architectures more).
	MaxCmdline = 64 << 10
	hostCID    = 2
)

// portNameRE is compiled on first use (a container guest never needs it).
var portNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })

// ParseCmdline splits a kernel command line into parameters the way the
// kernel does: words separated by spaces, a double-quoted part may contain
// spaces (the quotes are removed), and "--" ends the kernel's parameters.
// Later values of a repeated key win. Keys without '=' map to "".
func ParseCmdline(s string) (map[string]string, error) {
	if len(s) > MaxCmdline {
		return nil, fmt.Errorf("kernel command line longer than %d bytes", MaxCmdline)
	}
	params := map[string]string{}
	var word strings.Builder
	inQuote, have := false, false
	flush := func() bool {
		if !have {
			return true
		}
		w := word.String()
		word.Reset()
		have = false
		if w == "--" {
			return false
		}
		k, v, _ := strings.Cut(w, "=")
		params[k] = v
		return true
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0):
			if !flush() {
				return params, nil
			}
		default:
			word.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, errors.New("kernel command line has an unterminated double quote")
	}
	flush()
	return params, nil
}

// Transport is where the guest finds the host.
type Transport struct {
	// SerialName is the name of a virtio-serial port (serial:NAME).
	SerialName string
	// Vsock is set for vsock:[CID:]PORT.
	Vsock *transport.Endpoint
}

// String returns the parameter form.
func (t Transport) String() string {
	if t.Vsock != nil {
		return fmt.Sprintf("vsock:%d:%d", t.Vsock.CID, t.Vsock.Port)
	}
	return "serial:" + t.SerialName
}

// ParseTransport parses the value of oac.transport.
func ParseTransport(v string) (Transport, error) {
	kind, rest, _ := strings.Cut(v, ":")
	switch kind {
	case "serial":
		if !portNameRE().MatchString(rest) {
			return Transport{}, fmt.Errorf("%s: serial port name must be 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-' (write serial:NAME)", vmparams.Transport)
		}
		return Transport{SerialName: rest}, nil
	case "vsock":
		cid := uint64(hostCID)
		port := rest
		if c, p, ok := strings.Cut(rest, ":"); ok {
			var err error
			if cid, err = strconv.ParseUint(c, 10, 32); err != nil {
				return Transport{}, fmt.Errorf("%s: vsock CID must be a decimal 32-bit number (write vsock:PORT or vsock:CID:PORT)", vmparams.Transport)
			}
			port = p
		}
		p, err := strconv.ParseUint(port, 10, 32)
		if err != nil {
			return Transport{}, fmt.Errorf("%s: vsock port must be a decimal 32-bit number (write vsock:PORT or vsock:CID:PORT)", vmparams.Transport)
		}
		return Transport{Vsock: &transport.Endpoint{Scheme: transport.SchemeVsock, CID: uint32(cid), Port: uint32(p)}}, nil
	}
	return Transport{}, fmt.Errorf("%s: want serial:NAME or vsock:PORT", vmparams.Transport)
}

// Params are the oac.* settings of the kernel command line.
type Params struct {
	Transport Transport
	HostGrace time.Duration
	Debug     bool
	// Root is the block device of the image's root ("vda"); empty: the
	// guest runs from its initramfs.
	Root string
	// Keep is the block device of a kept sandbox's disk (see
	// vmparams.Keep); empty: every write lives in memory.
	Keep   string
	Shares []vmparams.Share
}

// ErrNotVM is returned by ParseParams when the command line has no
// oac.transport: oac-guest is not PID 1 of an oac VM.
var ErrNotVM = errors.New("no " + vmparams.Transport + " on the kernel command line")

// ParseParams extracts the oac.* parameters from a kernel command line.
func ParseParams(cmdline string) (Params, error) {
	if !strings.Contains(cmdline, vmparams.Transport+"=") {
		// Not an oac VM (under bubblewrap this is the host's command
		// line, which is none of our business).
		return Params{}, ErrNotVM
	}
	kv, err := ParseCmdline(cmdline)
	if err != nil {
		return Params{}, err
	}
	tv, ok := kv[vmparams.Transport]
	if !ok {
		return Params{}, ErrNotVM
	}
	p := Params{HostGrace: DefaultHostGrace}
	if p.Transport, err = ParseTransport(tv); err != nil {
		return Params{}, err
	}
	if g, ok := kv[vmparams.HostGrace]; ok {
		d, err := time.ParseDuration(g)
		if err != nil || d < MinHostGrace || d > MaxHostGrace {
			return Params{}, fmt.Errorf("%s must be a duration between %s and %s", vmparams.HostGrace, MinHostGrace, MaxHostGrace)
		}
		p.HostGrace = d
	}
	p.Debug = kv[vmparams.Debug] == "1"
	if r, ok := kv[vmparams.Root]; ok {
		if p.Root, err = vmparams.ParseRoot(r); err != nil {
			return Params{}, err
		}
	}
	if k, ok := kv[vmparams.Keep]; ok {
		if p.Keep, err = vmparams.ParseKeep(k); err != nil {
			return Params{}, err
		}
		if p.Keep == p.Root {
			return Params{}, fmt.Errorf("%s and %s name the same device %s", vmparams.Keep, vmparams.Root, p.Keep)
		}
	}
	if p.Shares, err = vmparams.ParseShares(kv[vmparams.Shares]); err != nil {
		return Params{}, err
	}
	return p, nil
}
