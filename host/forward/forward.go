package forward

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

// Defaults.
const (
	// DefaultMaxStreams bounds the forwarded connections open at once, all
	// forwards together; the next one is closed at once.
	DefaultMaxStreams = 128
	// MaxForwards bounds how many forwards may exist at once.
	MaxForwards = 64
)

// Errors.
var (
	ErrExists   = errors.New("a forward already listens there")
	ErrNotFound = errors.New("no such forward")
	ErrTooMany  = errors.New("too many forwards")
	ErrClosed   = errors.New("forwards are closed")
)

// Opener opens forward streams to the guest (sandbox.Session).
type Opener interface {
	OpenForward(port int, name string) (net.Conn, error)
}

// Config configures a Manager.
type Config struct {
	// MaxStreams bounds concurrent forwarded connections (DefaultMaxStreams).
	MaxStreams int
	// Emit receives forward events (listening, removed, refused); nil
	// drops them.
	Emit func(api.Event)
	Log  *slog.Logger
}

// Manager owns the forwards of one shim.
type Manager struct {
	cfg Config
	sem chan struct{}

	mu     sync.Mutex
	opener Opener
	fwds   map[string]*fwd
	order  []string
	closed bool
	wg     sync.WaitGroup
}

type fwd struct {
	spec  Spec
	addr  string
	ln    net.Listener
	conns map[net.Conn]struct{}
}

// New returns a Manager with no forwards and no guest attached.
func New(cfg Config) *Manager {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.Emit == nil {
		cfg.Emit = func(api.Event) {}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, sem: make(chan struct{}, cfg.MaxStreams), fwds: map[string]*fwd{}}
}

// SetOpener attaches the guest session new connections go to; nil
// detaches it (connections are then closed at once). Connections already
// carried keep their streams until those end.
func (m *Manager) SetOpener(o Opener) {
	m.mu.Lock()
	m.opener = o
	m.mu.Unlock()
}

func (m *Manager) emit(e api.Event) {
	e.Time = time.Now().UTC()
	e.Event = api.KindForward
	m.cfg.Emit(e)
}

// Add starts listening for spec and returns what is in force.
func (m *Manager) Add(spec Spec) (api.ForwardInfo, error) {
	if err := spec.Validate(); err != nil {
		return api.ForwardInfo{}, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return api.ForwardInfo{}, ErrClosed
	}
	if len(m.fwds) >= MaxForwards {
		m.mu.Unlock()
		return api.ForwardInfo{}, fmt.Errorf("%w: at most %d", ErrTooMany, MaxForwards)
	}
	if _, dup := m.fwds[spec.Listen]; dup {
		m.mu.Unlock()
		return api.ForwardInfo{}, fmt.Errorf("%w: %s", ErrExists, spec.Listen)
	}
	m.mu.Unlock()
	var ln net.Listener
	var err error
	if spec.IsUnix() {
		ln, err = sockfile.Listen(spec.Listen)
	} else {
		ln, err = net.Listen("tcp", spec.Listen)
	}
	if err != nil {
		return api.ForwardInfo{}, fmt.Errorf("forward %s: %w", spec, err)
	}
	f := &fwd{spec: spec, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	m.mu.Lock()
	if _, dup := m.fwds[f.addr]; dup || m.closed {
		m.mu.Unlock()
		ln.Close()
		if m.closed {
			return api.ForwardInfo{}, ErrClosed
		}
		return api.ForwardInfo{}, fmt.Errorf("%w: %s", ErrExists, f.addr)
	}
	m.fwds[f.addr] = f
	m.order = append(m.order, f.addr)
	m.wg.Add(1)
	m.mu.Unlock()
	go m.serve(f)
	info := api.ForwardInfo{Listen: f.addr, GuestPort: spec.GuestPort}
	m.emit(api.Event{Listen: info.Listen, GuestPort: info.GuestPort, Message: "listening"})
	return info, nil
}

// Remove closes the forward listening at listen (its bound address or
// socket path) and the connections it carries.
func (m *Manager) Remove(listen string) error {
	m.mu.Lock()
	f, ok := m.fwds[listen]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNotFound, safe(listen))
	}
	m.drop(f)
	m.mu.Unlock()
	m.emit(api.Event{Listen: f.addr, GuestPort: f.spec.GuestPort, Message: "removed"})
	return nil
}

// drop closes f's listener and connections; m.mu is held.
func (m *Manager) drop(f *fwd) {
	delete(m.fwds, f.addr)
	for i, a := range m.order {
		if a == f.addr {
			m.order = append(m.order[:i], m.order[i+1:]...)
			break
		}
	}
	f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
}

// List returns the forwards in force, in the order they were added.
func (m *Manager) List() []api.ForwardInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]api.ForwardInfo, 0, len(m.order))
	for _, a := range m.order {
		f := m.fwds[a]
		out = append(out, api.ForwardInfo{Listen: f.addr, GuestPort: f.spec.GuestPort, Active: len(f.conns)})
	}
	return out
}

// URLFor maps a URL inside the guest (http://127.0.0.1:PORT/...) to the
// host address of the first TCP forward to PORT, or "" when there is none
// (a unix socket forward has no URL).
func (m *Manager) URLFor(guestURL string) string {
	u, err := url.Parse(guestURL)
	if err != nil || u.Host == "" {
		return ""
	}
	switch u.Hostname() {
	case "127.0.0.1", "localhost", "::1", "0.0.0.0":
	default:
		return ""
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.order {
		f := m.fwds[a]
		if f.spec.GuestPort == port && !f.spec.IsUnix() {
			v := *u
			v.Host = f.addr
			return v.String()
		}
	}
	return ""
}

// Close removes every forward and waits for their connections to end.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	for _, a := range append([]string(nil), m.order...) {
		m.drop(m.fwds[a])
	}
	m.mu.Unlock()
	m.wg.Wait()
}

func (m *Manager) serve(f *fwd) {
	defer m.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		m.mu.Lock()
		_, live := m.fwds[f.addr]
		opener := m.opener
		if live {
			f.conns[c] = struct{}{}
			m.wg.Add(1)
		}
		m.mu.Unlock()
		if !live {
			c.Close()
			return
		}
		go m.carry(f, c, opener)
	}
}

func (m *Manager) carry(f *fwd, c net.Conn, opener Opener) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		delete(f.conns, c)
		m.mu.Unlock()
		c.Close()
	}()
	refuse := func(why string) {
		m.cfg.Log.Warn("forwarded connection refused", "listen", f.addr, "guest_port", f.spec.GuestPort, "reason", why)
		m.emit(api.Event{Listen: f.addr, GuestPort: f.spec.GuestPort, Message: "connection refused: " + why})
	}
	if opener == nil {
		refuse("no guest is connected")
		return
	}
	select {
	case m.sem <- struct{}{}:
		defer func() { <-m.sem }()
	default:
		refuse(fmt.Sprintf("%d forwarded connections are open, the limit", cap(m.sem)))
		return
	}
	st, err := opener.OpenForward(f.spec.GuestPort, "")
	if err != nil {
		refuse(err.Error())
		return
	}
	defer st.Close()
	_, _, _ = pipe.Join(c, st, nil)
}
