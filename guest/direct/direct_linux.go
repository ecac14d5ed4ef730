package direct

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/protocol"
)

// Bounds on a workload's trapped calls (the workload's calls wait beyond
// them; nothing is refused for it).
const (
	MaxRate     = 2000
	MaxBurst    = 256
	MaxInFlight = protocol.MaxStreams
	// maxAddr bounds the address read from the workload's memory
	// (sizeof(struct sockaddr_storage)).
	maxAddr = 128
	// maxInjected bounds the host sockets remembered as given; the
	// oldest is forgotten first (the kernel and the socket's lock still
	// refuse it anything but its upstream).
	maxInjected = 1 << 16
)

// Asker asks the host for its own socket connected to host:port (the fd
// channel's direct Connect). asked is false when the host could not be
// asked: the call then goes on to the capture.
type Asker func(ctx context.Context, host string, port int) (c *net.TCPConn, r protocol.EgressReply, asked bool)

// Config configures a Supervisor.
type Config struct {
	// Ask is the guest's one way out for direct mode (egress.Exit.Direct:
	// it maps a made-up address back to its name and checks the target).
	Ask Asker
	Log *slog.Logger
	// MaxInFlight overrides the bound of notifications handled at once
	// (tests).
	MaxInFlight int
}

// Supervisor answers the trapped calls of every listener it serves.
type Supervisor struct {
	cfg   Config
	limit *rate.Limiter
	sem   chan struct{}

	mu       sync.Mutex
	injected map[uint64]struct{} // socket cookies of the host's sockets given
	order    []uint64
}

// New returns a supervisor.
func New(cfg Config) *Supervisor {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = MaxInFlight
	}
	return &Supervisor{cfg: cfg, limit: rate.NewLimiter(MaxRate, MaxBurst), sem: make(chan struct{}, cfg.MaxInFlight), injected: map[uint64]struct{}{}}
}

// Kernel structures (linux/seccomp.h).
type seccompData struct {
	NR   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type notif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

type notifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

type notifAddfd struct {
	ID         uint64
	Flags      uint32
	SrcFD      uint32
	NewFD      uint32
	NewFDFlags uint32
}

// Serve answers l's notifications until every process under its filter
// is gone or ctx ends; it owns l and closes it (a trapped call then
// fails with ENOSYS: the sandbox is stopping).
func (s *Supervisor) Serve(ctx context.Context, l *os.File) {
	defer l.Close()
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		s.cfg.Log.Warn("direct mode: cannot watch a listener; its calls fail", "err", err)
		return
	}
	defer unix.Close(wake)
	stop := context.AfterFunc(ctx, func() {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(wake, one[:])
	})
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	lfd := int(l.Fd())
	for {
		fds := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.cfg.Log.Warn("direct mode: poll", "err", err)
			return
		}
		if fds[1].Revents != 0 || ctx.Err() != nil {
			return
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			return // POLLHUP: no process is left under the filter
		}
		if err := s.limit.Wait(ctx); err != nil {
			return
		}
		var n notif
		if err := ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
			// ENOENT: the caller went away (a fatal signal) meanwhile.
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINTR) {
				continue
			}
			s.cfg.Log.Warn("direct mode: receive", "err", err)
			return
		}
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.sem }()
			s.handle(ctx, lfd, n)
		}()
	}
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// handle answers one notification.
func (s *Supervisor) handle(ctx context.Context, lfd int, n notif) {
	reply := func(val int64, errno syscall.Errno, flags uint32) {
		r := notifResp{ID: n.ID, Val: val, Error: -int32(errno), Flags: flags}
		_ = ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&r))
	}
	goOn := func() { reply(0, 0, unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE) }
	call := workload.DirectCall(n.Data.Arch, uint32(n.Data.NR))
	if call == "" {
		reply(0, unix.ENOSYS, 0)
		return
	}
	targetFD := int(int32(n.Data.Args[0]))
	sock, err := s.socketOf(n.PID, targetFD)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			reply(0, unix.EBADF, 0) // not a descriptor of the caller's
			return
		}
		// The caller is gone, or this guest will not let the agent
		// look (Probe says so at start): the capture carries it.
		goOn()
		return
	}
	defer sock.Close()
	if s.given(sock.cookie) {
		// A host socket stays connected to its upstream: no reconnect
		// (AF_UNSPEC would disconnect it), bind or listen.
		reply(0, unix.EPERM, 0)
		return
	}
	if call != "connect" || !sock.tcp {
		goOn()
		return
	}
	raw, err := readAddr(n.PID, n.Data.Args[1], n.Data.Args[2])
	switch {
	case errors.Is(err, unix.EFAULT), errors.Is(err, errBadLength):
		reply(0, unix.EFAULT, 0) // what the kernel says of a bad address
		return
	case err != nil:
		goOn()
		return
	case !s.valid(lfd, n.ID):
		return // the caller is gone: its pid may be another's now
	}
	target, ok := ParseSockaddr(raw)
	if !ok || target.Addr().IsLoopback() || target.Addr().IsUnspecified() {
		goOn() // its own loopback, a disconnect, or an address the kernel will refuse
		return
	}
	c, r, asked := s.cfg.Ask(ctx, target.Addr().String(), int(target.Port()))
	if !asked {
		goOn() // the capture carries it, the handed way
		return
	}
	if !r.OK() {
		reply(0, errnoFor(r.Code), 0)
		return
	}
	defer c.Close()
	errno := s.put(lfd, n, targetFD, sock, c)
	if errno != 0 {
		reply(0, errno, 0)
		return
	}
	reply(0, 0, 0)
}

// put makes c's socket the caller's descriptor targetFD, with the file
// flags (O_NONBLOCK) and options (TCP_NODELAY, SO_KEEPALIVE) the
// caller's socket had, and close-on-exec as it was.
func (s *Supervisor) put(lfd int, n notif, targetFD int, orig *socket, c *net.TCPConn) syscall.Errno {
	rc, err := c.SyscallConn()
	if err != nil {
		return unix.EIO
	}
	var errno syscall.Errno
	var cookie uint64
	cerr := rc.Control(func(fd uintptr) {
		if err := setFlags(int(fd), orig); err != nil {
			errno = unix.EIO
			return
		}
		cookie, _ = sockCookie(int(fd))
		newFlags := uint32(0)
		if orig.cloexec {
			newFlags = unix.O_CLOEXEC
		}
		add := notifAddfd{ID: n.ID, Flags: unix.SECCOMP_ADDFD_FLAG_SETFD, SrcFD: uint32(fd), NewFD: uint32(targetFD), NewFDFlags: newFlags}
		if err := ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_ADDFD, unsafe.Pointer(&add)); err != nil {
			errno = unix.EIO
			if e, ok := err.(syscall.Errno); ok && e == unix.ENOENT {
				errno = unix.ENOENT // the caller is gone
			}
		}
	})
	if cerr != nil {
		return unix.EIO
	}
	if errno == 0 {
		s.remember(cookie)
	}
	return errno
}

// setFlags gives fd the caller's O_NONBLOCK and socket options.
func setFlags(fd int, orig *socket) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	fl = fl&^unix.O_NONBLOCK | orig.flags&unix.O_NONBLOCK
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl); err != nil {
		return err
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, orig.nodelay)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, orig.keepalive)
	return nil
}

// socket is what the supervisor learns of the caller's descriptor.
type socket struct {
	fd                 int // this process's duplicate
	cookie             uint64
	tcp                bool
	flags              int
	cloexec            bool
	nodelay, keepalive int
}

func (s *socket) Close() { unix.Close(s.fd) }

// socketOf duplicates the caller's descriptor fd (pidfd_getfd) and reads
// what the supervisor needs of it.
func (s *Supervisor) socketOf(pid uint32, fd int) (*socket, error) {
	// The notification names the calling thread, which is rarely the
	// thread group's leader in a threaded program.
	pidfd, err := unix.PidfdOpen(int(pid), pidfdThread)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, err
	}
	sk := &socket{fd: dup}
	sk.cookie, err = sockCookie(dup)
	if err != nil {
		// Not a socket: nothing here for the supervisor; the kernel
		// answers the call (ENOTSOCK).
		return sk, nil
	}
	dom, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_TYPE)
	proto, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	sk.tcp = (dom == unix.AF_INET || dom == unix.AF_INET6) && typ == unix.SOCK_STREAM && proto == unix.IPPROTO_TCP
	if !sk.tcp {
		return sk, nil
	}
	sk.flags, _ = unix.FcntlInt(uintptr(dup), unix.F_GETFL, 0)
	sk.nodelay, _ = unix.GetsockoptInt(dup, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	sk.keepalive, _ = unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	sk.cloexec = fdCloexec(pid, fd)
	return sk, nil
}

func sockCookie(fd int) (uint64, error) {
	var c uint64
	l := uint32(8)
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_COOKIE, uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return 0, e
	}
	return c, nil
}

// fdCloexec reads whether the caller's descriptor is close-on-exec (its
// fdinfo's flags; pidfd_getfd's copy is always close-on-exec).
func fdCloexec(pid uint32, fd int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && f&unix.O_CLOEXEC != 0
		}
	}
	return false
}

// pidfdThread is PIDFD_THREAD (Linux 6.9): a pidfd for a thread that is
// not its group's leader.
const pidfdThread = unix.O_EXCL

var errBadLength = errors.New("address length out of range")

// Probe reports whether this agent may do what supervising needs:
// duplicate a process's descriptor (pidfd_getfd) and read its memory
// (process_vm_readv). A container runtime's seccomp profile or missing
// CAP_SYS_PTRACE may refuse them; direct mode is then off.
func Probe() error {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd: %w", err)
	}
	unix.Close(fd)
	var src, dst [1]byte
	local := []unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(1)
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 1}}
	if _, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0); err != nil {
		return fmt.Errorf("process_vm_readv: %w", err)
	}
	return nil
}

// readAddr reads the caller's address argument, at most maxAddr bytes.
func readAddr(pid uint32, ptr, n uint64) ([]byte, error) {
	if n < 2 || n > maxAddr {
		return nil, fmt.Errorf("%w: %d", errBadLength, n)
	}
	buf := make([]byte, n)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(int(n))
	remote := []unix.RemoteIovec{{Base: uintptr(ptr), Len: int(n)}}
	got, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil {
		return nil, err
	}
	if got != int(n) {
		return nil, errors.New("short read of the address")
	}
	return buf, nil
}

// valid reports whether the notification still stands for a live call,
// so what was read belongs to it (its pid was not reused meanwhile).
func (s *Supervisor) valid(lfd int, id uint64) bool {
	return ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
}

// ParseSockaddr reads an AF_INET or AF_INET6 address from the bytes of a
// struct sockaddr the workload passed (untrusted: any bytes); anything
// else is not ok.
func ParseSockaddr(b []byte) (netip.AddrPort, bool) {
	if len(b) < 2 {
		return netip.AddrPort{}, false
	}
	switch binary.NativeEndian.Uint16(b) {
	case unix.AF_INET:
		if len(b) < 8 {
			return netip.AddrPort{}, false
		}
		port := binary.BigEndian.Uint16(b[2:])
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), true
	case unix.AF_INET6:
		if len(b) < 24 {
			return netip.AddrPort{}, false
		}
		port := binary.BigEndian.Uint16(b[2:])
		a := netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		return netip.AddrPortFrom(a, port), true
	}
	return netip.AddrPort{}, false
}

func (s *Supervisor) given(cookie uint64) bool {
	if cookie == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.injected[cookie]
	return ok
}

func (s *Supervisor) remember(cookie uint64) {
	if cookie == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.injected[cookie] = struct{}{}
	s.order = append(s.order, cookie)
	if len(s.order) > maxInjected {
		delete(s.injected, s.order[0])
		s.order = s.order[1:]
	}
}

// errnoFor is a refused connect's error, as a kernel would give it.
func errnoFor(c protocol.EgressCode) syscall.Errno {
	switch c {
	case protocol.EgressTimedOut:
		return unix.ETIMEDOUT
	case protocol.EgressUnreachable:
		return unix.ENETUNREACH
	case protocol.EgressResourceExhausted:
		return unix.EAGAIN
	case protocol.EgressCancelled:
		return unix.EINTR
	case protocol.EgressNameNotResolved, protocol.EgressNameResolutionFailed:
		return unix.EHOSTUNREACH
	}
	return unix.ECONNREFUSED // the policy, and a refused port
}
