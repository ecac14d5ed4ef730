package directguard

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSocketsThatWereNeverSealedAreUnaffected(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	for _, lo := range []string{"127.0.0.1", "::1"} {
		t.Run(lo, func(t *testing.T) {
			l, up := listen(t, lo)
			_, other := listen(t, lo)
			// A sealed socket exists meanwhile.
			dialLocked(t, g, up, true)
			_, err := l.Accept()
			require.NoError(t, err)

			family := unix.AF_INET
			if up.Addr().Is6() {
				family = unix.AF_INET6
			}
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			assert.NoError(t, unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo"), "SO_BINDTODEVICE")
			assert.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_LOCAL_PORT_RANGE, 40000|50000<<16), "IP_LOCAL_PORT_RANGE")
			assert.NoError(t, unix.Bind(fd, sockaddrOf(netip.AddrPortFrom(up.Addr(), 0))), "bind")
			require.NoError(t, unix.Connect(fd, sockaddrOf(up)), "connect")
			c, err := l.Accept()
			require.NoError(t, err)
			defer c.Close()
			_, err = unix.Write(fd, []byte("plain"))
			require.NoError(t, err)
			b := make([]byte, 5)
			_, err = c.Read(b)
			require.NoError(t, err)
			assert.Equal(t, "plain", string(b), "its packets go out")
			require.NoError(t, disconnect(fd))
			assert.NoError(t, unix.Connect(fd, sockaddrOf(other)), "reconnect elsewhere")

			// And through the net package, as the rest of the shim does.
			conn, err := net.Dial("tcp", other.String())
			require.NoError(t, err)
			conn.Close()
		})
	}
}

func TestALockedSocketThatIsNotSealedTalksAndStaysInTheShare(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	for _, lo := range []string{"127.0.0.1", "::1"} {
		t.Run(lo, func(t *testing.T) {
			l, up := listen(t, lo)
			c := dialLocked(t, g, up, false)
			port := c.LocalAddr().(*net.TCPAddr).Port
			slo, shi := g.Share()
			assert.True(t, port >= slo && port <= shi, "port %d in share %d-%d", port, slo, shi)
			s, err := l.Accept()
			require.NoError(t, err)
			defer s.Close()
			_, err = c.Write([]byte("hi"))
			require.NoError(t, err)
			b := make([]byte, 2)
			_, err = s.Read(b)
			require.NoError(t, err)
			assert.Equal(t, "hi", string(b))
		})
	}
}

func TestLockAndSealRefuseWhatIsNotADirectConnection(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer udp.Close()
	rc, err := udp.(*net.UDPConn).SyscallConn()
	require.NoError(t, err)
	assert.ErrorContains(t, g.Lock("udp4", netip.MustParseAddrPort("127.0.0.1:53"), rc), "TCP only")
	assert.ErrorContains(t, g.Seal(rc), "not a TCP socket")

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "unconnected")
	defer f.Close()
	rc, err = f.SyscallConn()
	require.NoError(t, err)
	assert.ErrorContains(t, g.Seal(rc), "no peer", "an unconnected socket has no upstream to keep it on")

	l, up := listen(t, "127.0.0.1")
	c, err := net.Dial("tcp4", up.String())
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()
	rc, err = c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	assert.ErrorContains(t, g.Seal(rc), "not locked", "a socket connected without its peer filter")
}

// lockFilter attaches and locks fd's peer filter, as Lock does.
func lockFilter(t *testing.T, fd int, peer netip.AddrPort) {
	t.Helper()
	prog, err := peerFilter(peer)
	require.NoError(t, err)
	require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog))
	require.NoError(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1))
}

func TestTheGuardRefusesToSealASocketMadeOutsideItsCgroup(t *testing.T) {
	needRoot(t)
	// A child in a cgroup of its own opens a guard there: it covers that
	// cgroup's sockets, not this process's.
	cg, parent, err := openCgroup()
	require.NoError(t, err)
	cg.Close()
	if strings.HasPrefix(parent, "(") {
		t.Skip("cgroup v2 is not mounted here, so a cgroup cannot be made for the child")
	}
	dir := filepath.Join(parent, fmt.Sprintf("oac-directguard-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	require.NoError(t, os.Mkdir(dir, 0o755))
	defer os.Remove(dir)
	cgfd, err := os.Open(dir)
	require.NoError(t, err)
	defer cgfd.Close()

	l, up := listen(t, "127.0.0.1")
	c, err := net.Dial("tcp4", up.String())
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()
	f, err := c.(*net.TCPConn).File()
	require.NoError(t, err)
	defer f.Close()
	lockFilter(t, int(f.Fd()), up)

	cmd := childCommand("outside-cgroup", "SHARE_DIR="+t.TempDir(), "PEER="+up.String())
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd()), Pdeathsig: syscall.SIGKILL}
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "handed: seal the direct socket: the guard does not cover this socket: it was made outside the guard's cgroup")
	assert.Contains(t, string(out), "own: sealed")
}

func TestOpenOfANonRootProcessSaysItNeedsRoot(t *testing.T) {
	needRoot(t)
	// The test binary, where an unprivileged user may run it.
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	exe := filepath.Join(dir, "directguard.test")
	b, err := os.ReadFile("/proc/self/exe")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(exe, b, 0o755))
	cmd := childCommand("share-holder", "SHARE_DIR="+filepath.Join(dir, "shares"))
	cmd.Path, cmd.Args[0] = exe, exe
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Stdin = strings.NewReader("")
	out, _ := cmd.Output()
	assert.Equal(t, "err direct mode needs the shim to run as root: its guard loads kernel programs and destroys sockets\n", string(out))
}
