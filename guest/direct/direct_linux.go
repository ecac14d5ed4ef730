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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/protocol"
)

const (
	// Workers are the goroutines, started ahead, that take the connects
	// of TCP sockets (the host's dial, or the workload's own blocking
	// connect): a slow one holds one worker, never another call. Beyond
	// them the workload's calls wait.
	Workers = protocol.MaxStreams
	// maxAddr bounds the address read from the workload's memory
	// (sizeof(struct sockaddr_storage), the kernel's own bound).
	maxAddr = 128
)

// Asker asks the host for its own socket connected to host:port (the fd
// channel's direct Connect); srcPort is the port the workload bound its
// socket to, or 0 (a refusal is recorded by it for the workload to ask
// why). asked is false when the host could not be asked: the connect is
// then made in the workload's namespace, where the capture takes it.
type Asker func(ctx context.Context, host string, port, srcPort int) (c *net.TCPConn, r protocol.EgressReply, asked bool)

// Config configures a Supervisor.
type Config struct {
	// Ask is the guest's one way out for direct mode (egress.Exit.Direct:
	// it maps a made-up address back to its name and checks the target).
	Ask Asker
	Log *slog.Logger
	// Workers overrides the number of workers (tests).
	Workers int
	// Netns is the cookie (SO_NETNS_COOKIE) of the network namespace the
	// workload's own sockets belong to (NetnsCookie, run there). A socket
	// of any other namespace is the host's.
	Netns uint64
}

// Supervisor answers the trapped calls of every listener it serves.
type Supervisor struct {
	cfg Config
	ctx context.Context
	// connects hands a TCP socket's connect to a worker (unbuffered: a
	// call is taken only when a worker is free).
	connects chan connectJob
	// unprivileged is net.ipv4.ip_unprivileged_port_start: the workload,
	// which has no capability, may not bind below it.
	unprivileged int
}

type connectJob struct {
	c    call
	sock *socket
	done func()
}

// New starts the supervisor's workers; they end with ctx, and every call
// trapped after that is refused (ENETDOWN: the sandbox is stopping).
func New(ctx context.Context, cfg Config) *Supervisor {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = Workers
	}
	s := &Supervisor{cfg: cfg, ctx: ctx, connects: make(chan connectJob), unprivileged: unprivilegedPortStart()}
	for range cfg.Workers {
		go func() {
			for {
				select {
				case j := <-s.connects:
					s.connect(j.c, j.sock)
					j.sock.Close()
					j.done()
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	return s
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
// is gone; it owns l and closes it. It receives on a locked OS thread
// with a blocking receive (the kernel wakes it when a call is trapped,
// and when the filter's last process exits: Linux 6.6 and later, which
// direct mode's Landlock rules imply), answers at once whatever needs no
// wait, and hands a TCP socket's connect to a worker.
func (s *Supervisor) Serve(l *os.File) {
	defer l.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lfd := int(l.Fd())
	// The trapped thread and this one hand the CPU to each other (Linux
	// 6.6): no cross-CPU wakeup per call. Older kernels refuse the flag.
	var flags uint64 = unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
	_ = ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, unsafe.Pointer(&flags))
	var pending sync.WaitGroup
	defer pending.Wait() // the workers' answers use lfd
	for {
		var n notif
		if err := ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.ENOENT):
				// A caller killed meanwhile, or no process left under
				// the filter (then the listener hangs up).
				if hungUp(lfd) {
					return
				}
				continue
			}
			s.cfg.Log.Warn("direct mode: receive", "err", err)
			return
		}
		s.handle(call{lfd: lfd, n: n}, &pending)
	}
}

// hungUp reports whether no process is left under the listener's filter.
func hungUp(lfd int) bool {
	fds := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
	_, err := unix.Poll(fds, 0)
	return err == nil && fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// call is one trapped call and its one answer.
type call struct {
	lfd int
	n   notif
}

func (c call) reply(val int64, errno syscall.Errno, flags uint32) {
	r := notifResp{ID: c.n.ID, Val: val, Error: -int32(errno), Flags: flags}
	_ = ioctl(c.lfd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&r))
}

// fail answers the call with errno.
func (c call) fail(errno syscall.Errno) { c.reply(0, errno, 0) }

// answer answers the call with the result of the supervisor's own call
// made on the workload's behalf.
func (c call) answer(err error) {
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		errno = unix.EIO
	}
	c.reply(0, errno, 0)
}

// goOn lets the kernel make the call itself. Only for a socket that is
// the workload's own and not TCP: the kernel then looks the descriptor
// and the address up again, and whatever another thread put there
// meanwhile, a TCP bind or connect of the workload's own is refused by
// its Landlock domain (package workload), and a socket the host gave is
// TCP.
func (c call) goOn() { c.reply(0, 0, unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE) }

// valid reports whether the notification still stands for a live call,
// so what was read belongs to it (its pid was not reused meanwhile).
func (c call) valid() bool {
	id := c.n.ID
	return ioctl(c.lfd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
}

// addr reads the call's address argument (arguments 1 and 2 of connect
// and bind) once: ok false means the call was answered (a bad length or
// pointer gets the kernel's own error) or its caller is gone.
func (c call) addr() ([]byte, bool) {
	n := int(int32(c.n.Data.Args[2]))
	if n < 0 || n > maxAddr {
		c.fail(unix.EINVAL)
		return nil, false
	}
	raw, err := readAddr(c.n.PID, c.n.Data.Args[1], n)
	if err != nil {
		c.fail(unix.EFAULT)
		return nil, false
	}
	return raw, c.valid()
}

// handle answers one notification, or hands it to a worker (pending
// counts those).
func (s *Supervisor) handle(c call, pending *sync.WaitGroup) {
	if s.ctx.Err() != nil {
		c.fail(unix.ENETDOWN)
		return
	}
	name := workload.DirectCall(c.n.Data.Arch, uint32(c.n.Data.NR))
	if name == "" {
		c.fail(unix.ENOSYS)
		return
	}
	sock, errno := s.look(c.n.PID, int(int32(c.n.Data.Args[0])))
	if errno != 0 {
		c.fail(errno)
		return
	}
	if !sock.own {
		// A socket of another namespace: the host's. It stays
		// connected to its upstream.
		sock.Close()
		c.fail(unix.EPERM)
		return
	}
	if name == "connect" && sock.tcp {
		pending.Add(1)
		select {
		case s.connects <- connectJob{c: c, sock: sock, done: pending.Done}:
		case <-s.ctx.Done():
			sock.Close()
			pending.Done()
			c.fail(unix.ENETDOWN)
		}
		return
	}
	defer sock.Close()
	switch {
	case name == "listen":
		// Made here on the descriptor looked at, never let through: no
		// kernel rule would stop a listen on a socket swapped in.
		c.answer(unix.Listen(sock.fd, int(int32(c.n.Data.Args[1]))))
	case !sock.tcp: // connect and bind of UDP, unix and other sockets
		c.goOn()
	default: // bind of a TCP socket: Landlock refuses the workload's own
		raw, ok := c.addr()
		if !ok {
			return
		}
		if s.privileged(raw) {
			c.fail(unix.EACCES) // as the kernel answers a process with no capability
			return
		}
		c.answer(rawSockaddrCall(unix.SYS_BIND, sock.fd, raw))
	}
}

// connect answers a connect of the workload's own TCP socket: to the
// outside with the host's socket put in place, else made on the
// workload's behalf on the descriptor looked at, with the address read
// (its loopback, a disconnect, what the host could not be asked about:
// the workload's namespace, and its capture, take it).
func (s *Supervisor) connect(c call, sock *socket) {
	raw, ok := c.addr()
	if !ok {
		return
	}
	target, ok := ParseSockaddr(raw)
	if !ok || target.Addr().IsLoopback() || target.Addr().IsUnspecified() {
		c.answer(rawSockaddrCall(unix.SYS_CONNECT, sock.fd, raw))
		return
	}
	up, r, asked := s.cfg.Ask(s.ctx, target.Addr().String(), int(target.Port()), boundPort(sock.fd))
	if !asked {
		c.answer(rawSockaddrCall(unix.SYS_CONNECT, sock.fd, raw))
		return
	}
	if !r.OK() {
		c.fail(errnoFor(r.Code))
		return
	}
	defer up.Close()
	c.fail(s.put(c, sock, up))
}

// boundPort is the local port fd was bound to, or 0.
func boundPort(fd int) int {
	switch sa, _ := unix.Getsockname(fd); a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

// rawSockaddrCall makes connect or bind on fd with the workload's own
// address bytes: the kernel judges them as it would have.
func rawSockaddrCall(trap uintptr, fd int, raw []byte) error {
	var none byte
	p := unsafe.Pointer(&none)
	if len(raw) > 0 {
		p = unsafe.Pointer(&raw[0])
	}
	_, _, e := unix.Syscall(trap, uintptr(fd), uintptr(p), uintptr(len(raw)))
	runtime.KeepAlive(raw)
	if e != 0 {
		return e
	}
	return nil
}

// privileged reports whether an inet address names a port below
// ip_unprivileged_port_start (0 asks the kernel for any port).
func (s *Supervisor) privileged(raw []byte) bool {
	if len(raw) < 4 {
		return false
	}
	switch binary.NativeEndian.Uint16(raw) {
	case unix.AF_INET, unix.AF_INET6, unix.AF_UNSPEC:
		port := int(binary.BigEndian.Uint16(raw[2:]))
		return port != 0 && port < s.unprivileged
	}
	return false
}

func unprivilegedPortStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return 1024
}

// put makes up's socket the caller's descriptor, with the file flags
// (O_NONBLOCK) and options (TCP_NODELAY, SO_KEEPALIVE) the caller's
// socket had, and close-on-exec as it was.
func (s *Supervisor) put(c call, orig *socket, up *net.TCPConn) syscall.Errno {
	rc, err := up.SyscallConn()
	if err != nil {
		return unix.EIO
	}
	var errno syscall.Errno
	cerr := rc.Control(func(fd uintptr) {
		if err := setFlags(int(fd), orig); err != nil {
			errno = unix.EIO
			return
		}
		newFlags := uint32(0)
		if fdCloexec(c.n.PID, orig.target) {
			newFlags = unix.O_CLOEXEC
		}
		add := notifAddfd{ID: c.n.ID, Flags: unix.SECCOMP_ADDFD_FLAG_SETFD, SrcFD: uint32(fd), NewFD: uint32(orig.target), NewFDFlags: newFlags}
		if err := ioctl(c.lfd, unix.SECCOMP_IOCTL_NOTIF_ADDFD, unsafe.Pointer(&add)); err != nil {
			errno = unix.EIO
			if errors.Is(err, unix.ENOENT) {
				errno = unix.ENOENT // the caller is gone
			}
		}
	})
	if cerr != nil {
		return unix.EIO
	}
	return errno
}

// setFlags gives fd the caller's O_NONBLOCK and socket options.
func setFlags(fd int, orig *socket) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	ofl, err := unix.FcntlInt(uintptr(orig.fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	fl = fl&^unix.O_NONBLOCK | ofl&unix.O_NONBLOCK
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl); err != nil {
		return err
	}
	for _, o := range [][2]int{{unix.IPPROTO_TCP, unix.TCP_NODELAY}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE}} {
		if v, err := unix.GetsockoptInt(orig.fd, o[0], o[1]); err == nil {
			_ = unix.SetsockoptInt(fd, o[0], o[1], v)
		}
	}
	return nil
}

// socket is what the supervisor learns of the caller's descriptor.
type socket struct {
	fd     int // this process's duplicate: the object looked at
	target int // the caller's descriptor number
	// own: of the workload's network namespace (else the host's).
	own bool
	tcp bool
}

func (s *socket) Close() { unix.Close(s.fd) }

// look duplicates the caller's descriptor (pidfd_getfd) and reads what
// the supervisor needs of it: whose namespace it belongs to, and whether
// it is TCP. Every later step works on the duplicate, never on the
// number again (another thread may put anything there meanwhile).
func (s *Supervisor) look(pid uint32, fd int) (*socket, syscall.Errno) {
	pidfd, err := openThread(pid)
	if err != nil {
		return nil, unix.ESRCH // the caller is gone; the answer goes nowhere
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, errno // EBADF: not a descriptor of the caller's
		}
		return nil, unix.EIO
	}
	sk := &socket{fd: dup, target: fd}
	cookie, err := unix.GetsockoptUint64(dup, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		unix.Close(dup)
		if errors.Is(err, unix.ENOTSOCK) {
			return nil, unix.ENOTSOCK // what the kernel answers
		}
		return nil, unix.EPERM // nothing known of it: never the workload's to use
	}
	sk.own = cookie == s.cfg.Netns
	dom, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_TYPE)
	proto, _ := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	sk.tcp = (dom == unix.AF_INET || dom == unix.AF_INET6) && typ == unix.SOCK_STREAM && proto == unix.IPPROTO_TCP
	return sk, 0
}

// openThread opens a pidfd for the calling thread named by a
// notification, which is rarely its group's leader in a threaded
// program: PIDFD_THREAD (Linux 6.9), else the thread group's (the
// threads of a process share its descriptors).
func openThread(tid uint32) (int, error) {
	fd, err := unix.PidfdOpen(int(tid), pidfdThread)
	if !errors.Is(err, unix.EINVAL) {
		return fd, err
	}
	tgid, terr := threadGroup(tid)
	if terr != nil {
		return -1, err
	}
	return unix.PidfdOpen(tgid, 0)
}

func threadGroup(tid uint32) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(tid)) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Tgid")
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

// NetnsCookie returns the cookie of the calling thread's network
// namespace (Config.Netns, when run in the workload's).
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}

// Probe reports whether direct mode's guarantees hold in this guest: the
// kernel refuses the workload's own TCP connects (Landlock's TCP rules),
// and the agent may look at the workload's descriptors and memory
// (pidfd_getfd, process_vm_readv, which a container runtime's seccomp
// profile or a missing CAP_SYS_PTRACE may refuse) and tell whose
// namespace a socket is of (SO_NETNS_COOKIE, Linux 5.14).
func Probe() error {
	if err := workload.LandlockTCP(); err != nil {
		return err
	}
	if _, err := NetnsCookie(); err != nil {
		return fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
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

// readAddr reads the caller's address argument, n bytes (at most
// maxAddr).
func readAddr(pid uint32, ptr uint64, n int) ([]byte, error) {
	buf := make([]byte, n)
	if n == 0 {
		return buf, nil
	}
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(n)
	remote := []unix.RemoteIovec{{Base: uintptr(ptr), Len: n}}
	got, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil {
		return nil, err
	}
	if got != n {
		return nil, errors.New("short read of the address")
	}
	return buf, nil
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
