package directguard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// pruneEvery is how many seals may add cookies before the set is pruned to
// the sockets still alive: the set follows the live sockets, not the
// history. (A variable for the tests.)
var pruneEvery = 4096

// Guard is one sandbox's direct-mode guard: its programs, its seal map,
// its port share and the cookies of the sockets it sealed.
type Guard struct {
	log    *slog.Logger
	share  *share
	lo, hi int
	m      *ebpf.Map
	mapID  uint32
	progs  []*ebpf.Program
	links  []link.Link
	diag   *diag

	// life is held for reading while the map or the sock_diag socket is
	// used, and for writing while Close frees them.
	life      sync.RWMutex
	closed    atomic.Bool // no more seals
	released  bool        // under life
	closeOnce sync.Once
	closeErr  error

	mu sync.Mutex
	// cookies maps a sealed socket's cookie to the seal's sequence number
	// (a prune drops only cookies older than its dump).
	cookies map[uint64]uint64
	seq     uint64
	added   int // seals since the last prune
}

// Open loads the guard's programs, attaches them to this process's own
// cgroup v2, and takes a port share; it then proves the guard on sockets
// of its own. It reads the port range and opens its sock_diag socket in
// the calling thread's network namespace: the one upstream sockets are
// made in. Its error says, in words fit for a user-facing event, why
// direct mode cannot be guarded here.
func Open(cfg Config) (_ *Guard, err error) {
	start := time.Now()
	cfg = cfg.withDefaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("direct mode needs the shim to run as root: its guard loads kernel programs and destroys sockets")
	}
	lo, hi, err := localPortRange()
	if err != nil {
		return nil, err
	}
	sh, err := takeShare(cfg.ShareDir, lo, hi, cfg.ShareSize)
	if err != nil {
		return nil, err
	}
	g := &Guard{log: cfg.Log, share: sh, lo: sh.lo, hi: sh.hi, cookies: make(map[uint64]uint64)}
	defer func() {
		if err != nil {
			_ = g.release()
		}
	}()
	if g.m, err = newSealMap(); err != nil {
		return nil, fmt.Errorf("direct mode cannot be guarded: the kernel has no socket storage for BPF programs (Linux 5.2 or later, and root): %w", err)
	}
	info, err := g.m.Info()
	if err != nil {
		return nil, fmt.Errorf("direct mode cannot be guarded: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return nil, errors.New("direct mode cannot be guarded: the kernel does not name its BPF maps (Linux 4.13 or later)")
	}
	g.mapID = uint32(id)
	ps := programs(g.m)
	for _, p := range ps {
		prog, err := loadProgram(p)
		if err != nil {
			return nil, err
		}
		g.progs = append(g.progs, prog)
	}
	cg, where, err := openCgroup()
	if err != nil {
		return nil, err
	}
	defer cg.Close()
	for i, p := range ps {
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: int(cg.Fd()), Program: g.progs[i], Attach: p.attach})
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("direct mode cannot be guarded: the kernel cannot attach cgroup programs as links (Linux 5.7 or later): %w", err)
		}
		if err != nil {
			return nil, fmt.Errorf("direct mode cannot be guarded: attaching the guard's %s program to cgroup %s failed: %w", p.name, where, err)
		}
		g.links = append(g.links, l)
	}
	if g.diag, err = openDiag(); err != nil {
		return nil, err
	}
	if err := g.diag.probeDestroy(); err != nil {
		return nil, err
	}
	if err := g.selfTest(); err != nil {
		return nil, err
	}
	g.log.Info("direct mode guard attached", "cgroup", where, "ports", fmt.Sprintf("%d-%d", g.lo, g.hi), "took", time.Since(start))
	return g, nil
}

// selfTest proves the guard holds for this process's sockets: the port
// range option exists, and a marked socket is refused a setsockopt, a
// bind and a connect.
func (g *Guard) selfTest() error {
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if family == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT) {
			continue // no IPv6 here
		}
		if err != nil {
			return fmt.Errorf("direct mode cannot be guarded: %w", err)
		}
		err = g.selfTestOn(fd, family)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *Guard) selfTestOn(fd, family int) error {
	if err := setPortRange(fd, g.lo, g.hi); err != nil {
		if errors.Is(err, unix.ENOPROTOOPT) {
			return errors.New("direct mode cannot be guarded: the kernel has no per-socket port range (IP_LOCAL_PORT_RANGE, Linux 6.3 or later)")
		}
		return fmt.Errorf("direct mode cannot be guarded: %w", err)
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	var sa unix.Sockaddr = &unix.SockaddrInet4{Addr: loopback.As4(), Port: 9}
	if family == unix.AF_INET6 {
		loopback = netip.IPv6Loopback()
		sa = &unix.SockaddrInet6{Addr: loopback.As16(), Port: 9}
	}
	if err := g.m.Update(uint32(fd), sealValueFor(loopback), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("direct mode cannot be guarded: marking a socket failed: %w", err)
	}
	if err := probeRefused(fd); err != nil {
		return fmt.Errorf("direct mode cannot be guarded: %w", err)
	}
	if err := unix.Bind(fd, sa); !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("direct mode cannot be guarded: a marked socket's bind was not refused (%v)", err)
	}
	if err := unix.Connect(fd, sa); !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("direct mode cannot be guarded: a marked socket's connect was not refused (%v)", err)
	}
	return nil
}

// probeRefused proves the guard's setsockopt program runs for fd's socket
// (it runs for sockets made in the guard's cgroup or below): it refuses
// IP_OPTIONS of 41 bytes on a marked socket, which the kernel itself would
// refuse with EINVAL (options take at most 40), changing nothing either
// way.
func probeRefused(fd int) error {
	var b [41]byte
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_IP, unix.IP_OPTIONS, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
	switch e {
	case unix.EPERM:
		return nil
	case unix.EINVAL:
		return errors.New("the guard does not cover this socket: it was made outside the guard's cgroup")
	}
	return fmt.Errorf("the guard's setsockopt probe answered %v", e)
}

func setPortRange(fd, lo, hi int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_LOCAL_PORT_RANGE, lo|hi<<16)
}

// Share returns the share's port range.
func (g *Guard) Share() (lo, hi int) { return g.lo, g.hi }

// Lock prepares an upstream socket before it connects to remote (the
// egress broker calls it from net.Dialer.Control; it is an egress.Lock):
//
//   - the share's port range (IP_LOCAL_PORT_RANGE): the kernel's automatic
//     bind at connect picks a port inside the share, skipping
//     ip_local_reserved_ports;
//   - a classic BPF socket filter admitting only segments from remote's
//     address and port, locked (SO_LOCK_FILTER: it can be neither removed
//     nor replaced, whoever holds the socket). A socket made to listen or
//     connect elsewhere completes no handshake.
func (g *Guard) Lock(network string, remote netip.AddrPort, rc syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return fmt.Errorf("direct mode carries TCP only, not %s", network)
	}
	if g.closed.Load() {
		return errClosed
	}
	prog, err := peerFilter(remote)
	if err != nil {
		return err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		if serr = setPortRange(int(fd), g.lo, g.hi); serr != nil {
			serr = fmt.Errorf("confine the socket to the port share: %w", serr)
			return
		}
		if serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); serr != nil {
			serr = fmt.Errorf("attach the peer filter: %w", serr)
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); serr != nil {
			serr = fmt.Errorf("lock the peer filter: %w", serr)
		}
	})
	return errors.Join(cerr, serr)
}

var errClosed = errors.New("direct mode's guard is closed")

// Seal marks a connected upstream socket, before it is handed to the
// guest: from then on the kernel refuses connect (any address, also after
// an AF_UNSPEC disconnect), bind, and the setsockopt options of
// internal/netreach.Sockopts (and IP_LOCAL_PORT_RANGE) on it, and drops
// its packets to anything but its peer, whoever holds it. It refuses a
// socket that was not locked (Lock) or that the guard does not cover (one
// made outside this process's cgroup). It records the socket's cookie for
// Abort; it keeps no descriptor.
func (g *Guard) Seal(rc syscall.RawConn) error {
	g.life.RLock()
	defer g.life.RUnlock()
	if g.closed.Load() {
		return errClosed
	}
	var cookie uint64
	var serr error
	cerr := rc.Control(func(fd uintptr) { cookie, serr = g.seal(int(fd)) })
	if err := errors.Join(cerr, serr); err != nil {
		return fmt.Errorf("seal the direct socket: %w", err)
	}
	g.mu.Lock()
	g.seq++
	g.cookies[cookie] = g.seq
	g.added++
	prune := g.added >= pruneEvery
	if prune {
		g.added = 0
	}
	g.mu.Unlock()
	if prune {
		if _, err := g.live(); err != nil {
			g.log.Warn("direct mode guard: pruning sealed sockets' cookies failed", "err", err)
		}
	}
	return nil
}

func (g *Guard) seal(fd int) (uint64, error) {
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return 0, err
	}
	if proto != unix.IPPROTO_TCP {
		return 0, fmt.Errorf("not a TCP socket (protocol %d)", proto)
	}
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return 0, fmt.Errorf("the socket has no peer: %w", err)
	}
	// Locked first: whoever holds a sealed socket must find its peer
	// filter in place.
	locked, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER)
	if err != nil {
		return 0, err
	}
	if locked == 0 {
		return 0, errors.New("the socket was not locked to its upstream before it connected (Lock)")
	}
	var peer netip.Addr
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		peer = netip.AddrFrom4(sa.Addr)
	case *unix.SockaddrInet6:
		peer = netip.AddrFrom16(sa.Addr)
	default:
		return 0, errors.New("not an internet socket")
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("read the socket's cookie: %w", err)
	}
	if err := g.m.Update(uint32(fd), sealValueFor(peer), ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("mark the socket: %w", err)
	}
	if err := probeRefused(fd); err != nil {
		_ = g.m.Delete(uint32(fd))
		return 0, err
	}
	return cookie, nil
}

// live lists the sockets to abort: those that carry the seal (open, or
// orphaned while closing; accepted ones too) and those whose cookie was
// sealed (TIME_WAIT entries carry no storage, but keep the cookie). It
// prunes the cookie set to the sockets alive.
func (g *Guard) live() ([]diagEntry, error) {
	g.mu.Lock()
	start := g.seq
	g.mu.Unlock()
	var all []diagEntry
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		es, err := g.diag.dump(family, g.m.FD(), g.mapID)
		if family == unix.AF_INET6 && errors.Is(err, unix.ENOENT) {
			continue // no IPv6 here
		}
		if err != nil {
			return nil, err
		}
		all = append(all, es...)
	}
	alive := make(map[uint64]bool, len(all))
	var out []diagEntry
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range all {
		alive[e.ID.Cookie] = true
		if _, ok := g.cookies[e.ID.Cookie]; ok || e.Sealed {
			out = append(out, e)
		}
	}
	for c, seq := range g.cookies {
		if seq <= start && !alive[c] {
			delete(g.cookies, c)
		}
	}
	return out, nil
}

// Abort destroys every sealed socket still alive (open, orphaned in
// FIN-WAIT, or in TIME_WAIT), via sock_diag SOCK_DESTROY matched by
// cookie (the peer gets a reset), and returns how many. It is for when the
// sandbox's guest has stopped.
func (g *Guard) Abort() (int, error) {
	g.life.RLock()
	defer g.life.RUnlock()
	if g.released {
		return 0, errClosed
	}
	return g.abort()
}

func (g *Guard) abort() (int, error) {
	total := 0
	var errs []error
	// A second look finds what moved while the first was destroyed (a
	// closing socket reaching TIME_WAIT under a new entry).
	for range 3 {
		es, err := g.live()
		if err != nil {
			return total, fmt.Errorf("direct mode's abort: %w", err)
		}
		n := 0
		for _, e := range es {
			switch err := g.diag.destroy(e); {
			case err == nil:
				n++
			case errors.Is(err, errNoSocket):
			default:
				errs = append(errs, err)
			}
		}
		total += n
		if n == 0 {
			break
		}
	}
	if len(errs) > 0 {
		return total, fmt.Errorf("direct mode's abort: destroying %d sockets failed: %w", len(errs), errors.Join(errs...))
	}
	return total, nil
}

// Close aborts, detaches the programs and releases the share. Safe to
// call twice.
func (g *Guard) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		// With no seal under way (a seal that got in first is found by
		// its storage and its cookie), and none after.
		g.life.Lock()
		defer g.life.Unlock()
		_, err := g.abort()
		g.released = true
		g.closeErr = errors.Join(err, g.release())
	})
	return g.closeErr
}

// release detaches and frees everything Open took.
func (g *Guard) release() error {
	var errs []error
	for _, l := range g.links {
		errs = append(errs, l.Close())
	}
	g.links = nil
	for _, p := range g.progs {
		errs = append(errs, p.Close())
	}
	g.progs = nil
	if g.m != nil {
		errs = append(errs, g.m.Close())
	}
	if g.diag != nil {
		errs = append(errs, g.diag.close())
	}
	errs = append(errs, g.share.release())
	return errors.Join(errs...)
}
