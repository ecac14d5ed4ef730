package direct

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/protocol"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

// needRoot: the workload runs in a network namespace of its own, as uid
// 1000, and the supervisor looks at its descriptors.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: these tests need root")
	}
	t.Skip("needs root (a network namespace for the workload, and uid 1000 for it)")
}

// host is the test's stand-in for the host: an upstream to connect
// allowed targets to, the targets it refuses, and what it was asked.
type host struct {
	t        *testing.T
	upstream *net.TCPListener
	mu       sync.Mutex
	asked    []string
	inFlight atomic.Int32
	maxSeen  atomic.Int32
	// during, when set, runs while a connect is trapped (before the
	// answer).
	during func()
}

func (h *host) ask(ctx context.Context, name string, port, _ int) (*net.TCPConn, protocol.EgressReply, bool) {
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for {
		m := h.maxSeen.Load()
		if n <= m || h.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	h.mu.Lock()
	h.asked = append(h.asked, net.JoinHostPort(name, itoa(port)))
	during := h.during
	h.mu.Unlock()
	if during != nil {
		during()
	}
	switch name {
	case "198.18.0.5": // a made-up address the exit maps to allowed.test
		name = "allowed.test"
		fallthrough
	case "allowed.test":
		c, err := net.DialTCP("tcp4", nil, h.upstream.Addr().(*net.TCPAddr))
		if err != nil {
			return nil, protocol.EgressReply{Code: protocol.EgressIO}, true
		}
		return c, protocol.EgressReply{Code: protocol.EgressOK, Rule: "allowed.test:*"}, true
	case "192.0.2.99":
		return nil, protocol.EgressReply{}, false // the host could not be asked
	}
	return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "no rule allows it"}, true
}

// got is what the host was asked, in order.
func (h *host) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.asked...)
}

func (h *host) setDuring(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.during = f
}

func itoa(n int) string { return strconv.Itoa(n) }

// workloadProc is the hostile workload under direct mode, in a network
// namespace of its own.
type workloadProc struct {
	t   *testing.T
	in  io.Writer
	out *bufio.Scanner
	// trigger and ack drive its rewriter thread; give passes it a
	// descriptor ("take").
	trigger, ack *os.File
	give         *os.File
}

func (w *workloadProc) do(cmd string) string {
	w.t.Helper()
	_, err := io.WriteString(w.in, cmd+"\n")
	require.NoError(w.t, err)
	require.True(w.t, w.out.Scan(), "the workload answered %q", cmd)
	return w.out.Text()
}

// start runs the workload and its supervisor (with workers workers, 0 for
// the default), whose fake host is h.
func start(t *testing.T, workers int) (*workloadProc, *host) {
	t.Helper()
	needRoot(t)
	up, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { up.Close() })
	h := &host{t: t, upstream: up}

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	mine, theirs := os.NewFile(uintptr(pair[0]), "direct"), os.NewFile(uintptr(pair[1]), "direct")
	defer mine.Close()
	trigR, trigW, err := os.Pipe()
	require.NoError(t, err)
	ackR, ackW, err := os.Pipe()
	require.NoError(t, err)
	gp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	give, take := os.NewFile(uintptr(gp[0]), "give"), os.NewFile(uintptr(gp[1]), "take")
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), childEnv+"=1", "GORACE=atexit_sleep_ms=0") // a race build sleeps 1 s at exit otherwise
	cmd.ExtraFiles = []*os.File{theirs, trigR, ackW, take}                    // fds 3, 4, 5, 6
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	for _, f := range []*os.File{theirs, trigR, ackW, take} {
		f.Close()
	}
	w := &workloadProc{t: t, in: stdin, out: bufio.NewScanner(stdout), trigger: trigW, ack: ackR, give: give}

	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(mine.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	require.NoError(t, err)
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	require.Len(t, msgs, 1, "the workload passed its listener (else it printed why on stdout)")
	fds, err := unix.ParseUnixRights(&msgs[0])
	require.NoError(t, err)
	listener := os.NewFile(uintptr(fds[0]), "seccomp listener")
	require.True(t, w.out.Scan())
	ready := strings.Fields(w.out.Text())
	require.Len(t, ready, 2, "ready line: %q", w.out.Text())
	require.Equal(t, "ready", ready[0])
	cookie, err := strconv.ParseUint(ready[1], 10, 64)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	sup := New(ctx, Config{Ask: h.ask, Workers: workers, Netns: cookie})
	served := make(chan struct{})
	go func() { sup.Serve(listener); close(served) }()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		<-served // the filter's last process is gone: Serve returns by itself
		cancel()
		for _, f := range []*os.File{trigW, ackR, give} {
			f.Close()
		}
	})
	return w, h
}

func accept(t *testing.T, l *net.TCPListener) net.Conn {
	t.Helper()
	c, err := l.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func fdOf(t *testing.T, answer string) string {
	t.Helper()
	require.True(t, strings.HasPrefix(answer, "ok "), "answer %q", answer)
	return strings.Fields(answer)[1]
}

// echoes checks fd, in the workload, still reaches up and only up.
func echoes(t *testing.T, w *workloadProc, fd string, up net.Conn) {
	t.Helper()
	assert.Equal(t, "ok 2", w.do("write "+fd+" ok"))
	buf := make([]byte, 2)
	require.NoError(t, up.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.ReadFull(up, buf)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(buf))
}

func TestAConnectOutsideGetsTheHostsSocketWithNoRelay(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	up := accept(t, h.upstream)
	assert.Equal(t, []string{"198.18.0.5:443"}, h.got(), "the address as the workload gave it: the exit maps it")
	echoes(t, w, fd, up)
	// The workload's descriptor is the host's socket itself: its peer is
	// the upstream, not a relay in the guest.
	assert.Equal(t, "ok "+h.upstream.Addr().String(), w.do("peer "+fd))
}

func TestANonBlockingConnectKeepsItsFlags(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect-nonblock 198.18.0.5:443"))
	accept(t, h.upstream)
	assert.Equal(t, "ok 2048", w.do("flags "+fd), "O_NONBLOCK as the workload set it")
}

func TestARefusedConnectFailsWithTheRefusal(t *testing.T) {
	w, h := start(t, 0)
	assert.Equal(t, "err ECONNREFUSED", w.do("connect 192.0.2.66:443"))
	assert.Equal(t, []string{"192.0.2.66:443"}, h.got(), "an address no name holds stays a literal")
}

func TestItsOwnServerAndLoopbackConnectsAreMadeForItNeverAsked(t *testing.T) {
	w, h := start(t, 0)
	// Landlock refuses the workload's own TCP bind, listen's autobind is
	// no bind, and its connect: the supervisor makes each of them, on
	// the descriptor it looked at.
	srv := strings.Fields(w.do("serve"))
	require.Len(t, srv, 3, "serve: %v", srv)
	fd := fdOf(t, w.do("connect 127.0.0.1:"+srv[2]))
	fdOf(t, w.do("accept "+srv[1]))
	assert.Equal(t, "ok 127.0.0.1:"+srv[2], w.do("peer "+fd))
	assert.Empty(t, h.got(), "its loopback is its own: the host is not asked")
	assert.Equal(t, "ok 0", w.do("bind-port 8080"))
	assert.Equal(t, "err EACCES", w.do("bind-port 80"), "uid 1000 may not bind a privileged port, whoever makes the call")
}

func TestAConnectTheHostCannotTakeIsMadeInTheWorkloadsNamespace(t *testing.T) {
	w, h := start(t, 0)
	// Not asked: the connect is made in the workload's own namespace
	// (where a sandbox's capture carries it); here that has only lo.
	assert.Equal(t, "err ENETUNREACH", w.do("connect-once 192.0.2.99:80"))
	assert.Equal(t, []string{"192.0.2.99:80"}, h.got())
}

func TestUDPAndUnixConnectsGoOnUnasked(t *testing.T) {
	w, h := start(t, 0)
	assert.Equal(t, "ok 0", w.do("udp-connect 127.0.0.1:53"), "what the kernel does with it in the workload's namespace")
	assert.Equal(t, "ok 0", w.do("unix-connect"))
	assert.Empty(t, h.got())
}

func TestAHostSocketCannotBeReconnectedBoundOrListenedOn(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	up := accept(t, h.upstream)
	assert.Equal(t, "err EPERM", w.do("disconnect "+fd), "connect(AF_UNSPEC) would disconnect it")
	assert.Equal(t, "err EPERM", w.do("reconnect "+fd+" 198.18.0.5:443"))
	assert.Equal(t, "err EPERM", w.do("bind "+fd))
	assert.Equal(t, "err EPERM", w.do("listen "+fd))
	echoes(t, w, fd, up)
	assert.Len(t, h.got(), 1)
}

func TestAHostSocketIsKnownByItsNamespaceNotByMemory(t *testing.T) {
	w, h := start(t, 0)
	// A host socket the supervisor never handed (root in the guest could
	// pass one on): whatever the supervisor remembers or forgot, the
	// kernel says whose it is.
	c, err := net.DialTCP("tcp4", nil, h.upstream.Addr().(*net.TCPAddr))
	require.NoError(t, err)
	defer c.Close()
	up := accept(t, h.upstream)
	f, err := c.File()
	require.NoError(t, err)
	require.NoError(t, unix.Sendmsg(int(w.give.Fd()), []byte{'F'}, unix.UnixRights(int(f.Fd())), nil, 0))
	f.Close()
	fd := fdOf(t, w.do("take"))
	assert.Equal(t, "err EPERM", w.do("disconnect "+fd))
	assert.Equal(t, "err EPERM", w.do("reconnect "+fd+" 198.18.0.5:443"))
	assert.Equal(t, "err EPERM", w.do("bind "+fd))
	assert.Equal(t, "err EPERM", w.do("listen "+fd))
	echoes(t, w, fd, up)
	assert.Empty(t, h.got())
}

func TestTheHostsNetworkCannotBeListedOrBoundThroughAHostSocket(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	accept(t, h.upstream)
	assert.Equal(t, "err EPERM", w.do("ifconf "+fd), "SIOCGIFCONF would list the host's interfaces")
	assert.Equal(t, "err EPERM", w.do("bindtodevice "+fd+" lo"))
}

func TestFastOpenIsRefused(t *testing.T) {
	w, h := start(t, 0)
	assert.Equal(t, "err EPERM", w.do("fastopen 198.18.0.5:443"), "a send that connects would bypass the trap")
	assert.Empty(t, h.got())
}

func TestASecondThreadRewritingTheAddressDuringTheCheckChangesNothing(t *testing.T) {
	w, h := start(t, 0)
	decoy, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer decoy.Close()
	assert.Equal(t, "ok 0", w.do("rewrite-to "+decoy.Addr().String()))
	// While the host decides, the workload's other thread points the
	// address at its loopback decoy.
	h.setDuring(func() {
		_, err := w.trigger.Write([]byte{1})
		require.NoError(t, err)
		_, err = w.ack.Read(make([]byte, 1))
		require.NoError(t, err)
	})
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	accept(t, h.upstream)
	assert.Equal(t, "ok "+h.upstream.Addr().String(), w.do("peer "+fd), "connected where the host decided, not where the address points now")
	assert.Equal(t, []string{"198.18.0.5:443"}, h.got())
}

func TestSwappingAHostSocketInDuringTheCheckReachesNothing(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	up := accept(t, h.upstream)
	local := strings.TrimPrefix(w.do("local "+fd), "ok ")
	// A service on the host's own loopback, which the host socket could
	// reach if it were disconnected and connected again.
	svc, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer svc.Close()
	port := uint16(svc.Addr().(*net.TCPAddr).Port)
	seen := watchTCP(t, port)
	// Four threads, 5,000 calls each, while another swaps the number
	// between the host socket and the workload's own UDP and TCP ones.
	got := w.do(fmt.Sprintf("race %s 5000 127.0.0.1:%d", fd, port))
	require.True(t, strings.HasPrefix(got, "ok "), got)
	t.Logf("calls that found the host socket and succeeded: %s", strings.TrimPrefix(got, "ok "))
	assert.Zero(t, seen.stop(), "no segment from the host to its own service")
	assert.False(t, listening(t, local), "the host socket is not listening")
	// Its disconnect is the one thing the race can do to it (Landlock
	// lets a disconnect through): then it is connected to nothing.
	peer := w.do("peer " + fd)
	if peer != "err ENOTCONN" {
		assert.Equal(t, "ok "+h.upstream.Addr().String(), peer)
		echoes(t, w, fd, up)
	}
}

func TestAFloodOfConnectsIsAnsweredWithinTheBounds(t *testing.T) {
	w, h := start(t, 2)
	// Eight processes under the filter, 50 connects each, all at once.
	assert.Equal(t, "ok 0", w.do("flood 8 50 192.0.2.66:443"), "every connect was answered with the refusal")
	assert.Len(t, h.got(), 400)
	assert.LessOrEqual(t, h.maxSeen.Load(), int32(2), "at most Workers at once")
}
