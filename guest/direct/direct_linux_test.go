package direct

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

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

func (h *host) ask(ctx context.Context, name string, port int) (*net.TCPConn, protocol.EgressReply, bool) {
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

// workloadProc is the hostile workload under direct mode's filter.
type workloadProc struct {
	t   *testing.T
	in  io.Writer
	out *bufio.Scanner
	// trigger and ack drive its rewriter thread.
	trigger, ack *os.File
}

func (w *workloadProc) do(cmd string) string {
	w.t.Helper()
	_, err := io.WriteString(w.in, cmd+"\n")
	require.NoError(w.t, err)
	require.True(w.t, w.out.Scan(), "the workload answered %q", cmd)
	return w.out.Text()
}

// start runs the workload and its supervisor, whose fake host is h.
func start(t *testing.T, maxInFlight int) (*workloadProc, *host) {
	t.Helper()
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
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{theirs, trigR, ackW}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	theirs.Close()
	trigR.Close()
	ackW.Close()
	w := &workloadProc{t: t, in: stdin, out: bufio.NewScanner(stdout), trigger: trigW, ack: ackR}
	require.True(t, w.out.Scan())
	require.Equal(t, "ready", w.out.Text())

	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(mine.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	require.NoError(t, err)
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	fds, err := unix.ParseUnixRights(&msgs[0])
	require.NoError(t, err)
	listener := os.NewFile(uintptr(fds[0]), "seccomp listener")

	sup := New(Config{Ask: h.ask, MaxInFlight: maxInFlight})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { sup.Serve(ctx, listener); close(served) }()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		cancel()
		<-served
		trigW.Close()
		ackR.Close()
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
	return strings.TrimPrefix(answer, "ok ")
}

func TestAConnectOutsideGetsTheHostsSocketWithNoRelay(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	up := accept(t, h.upstream)
	assert.Equal(t, []string{"198.18.0.5:443"}, h.got(), "the address as the workload gave it: the exit maps it")
	assert.Equal(t, "ok 2", w.do("write "+fd+" hi"))
	buf := make([]byte, 2)
	_, err := io.ReadFull(up, buf)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(buf))
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

func TestAConnectToItsOwnLoopbackOrOneTheHostCannotTakeGoesOn(t *testing.T) {
	w, h := start(t, 0)
	own, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer own.Close()
	fdOf(t, w.do("connect "+own.Addr().String()))
	accept(t, own)
	assert.Empty(t, h.got(), "its loopback is its own: the host is not asked")
	got := w.do("connect-once 192.0.2.99:80")
	assert.Equal(t, []string{"192.0.2.99:80"}, h.got())
	// Not asked: the call goes on in the workload's own namespace (where
	// a sandbox's capture carries it), with the kernel's own result.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_SYNCNT, 1))
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 99}, Port: 80})
	require.Error(t, err)
	assert.Equal(t, "err "+unix.ErrnoName(err.(unix.Errno)), got)
}

func TestAHostSocketCannotBeReconnectedBoundOrListenedOn(t *testing.T) {
	w, h := start(t, 0)
	fd := fdOf(t, w.do("connect 198.18.0.5:443"))
	up := accept(t, h.upstream)
	assert.Equal(t, "err EPERM", w.do("disconnect "+fd), "connect(AF_UNSPEC) would disconnect it")
	assert.Equal(t, "err EPERM", w.do("reconnect "+fd+" 198.18.0.5:443"))
	assert.Equal(t, "err EPERM", w.do("bind "+fd))
	assert.Equal(t, "err EPERM", w.do("listen "+fd))
	// Still connected to its upstream, and only to it.
	assert.Equal(t, "ok 2", w.do("write "+fd+" ok"))
	buf := make([]byte, 2)
	_, err := io.ReadFull(up, buf)
	require.NoError(t, err)
	assert.Len(t, h.got(), 1)
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

func TestAFloodOfConnectsIsAnsweredWithinTheBounds(t *testing.T) {
	w, h := start(t, 2)
	// Eight processes under the filter, 50 connects each, all at once.
	assert.Equal(t, "ok 0", w.do("flood 8 50 192.0.2.66:443"), "every connect was answered with the refusal")
	assert.Len(t, h.got(), 400)
	assert.LessOrEqual(t, h.maxSeen.Load(), int32(2), "at most MaxInFlight at once")
}
