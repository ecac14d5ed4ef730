//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/guest/netns"
	"github.com/oac/sandbox-agent/protocol"
)

// The data plane column: the bytes of a proxied (CONNECT) and a captured
// connection cross checksummed both ways on whatever carries them on the
// row (the fd channel, dialed data connections, or the session's yamux
// streams where the transport has no other carrier), the events show each
// connection as on the session, and where the guest holds ends of pairs
// the host made, those ends reach nothing else.

// Carriers a row's guest names in its log.
const (
	carrierFD      = "fd channel"
	carrierHand    = "hand-only fd channel and data connections"
	carrierDial    = "data connections"
	carrierSession = "session"
)

// echoPattern is what the daemon stand-in's echo probes send (its
// EchoPattern, which the test cannot import from a main package).
func echoPattern() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i*31 + i>>11)
	}
	return b
}

// rawEcho serves an echo of raw bytes (half-closing after its peer did).
func rawEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// carrierOf names the carrier the guest's log says it uses.
func carrierOf(log string) string {
	switch {
	case strings.Contains(log, "data plane: hand-only fd channel up"):
		return carrierHand
	case strings.Contains(log, "data plane: fd channel up"):
		return carrierFD
	case strings.Contains(log, "data plane: data connections"):
		return carrierDial
	}
	return carrierSession
}

func promiseDataPlane(t *testing.T, c *confCase) {
	s := c.live(t)
	sum := sha256.Sum256(echoPattern())
	want := fmt.Sprintf("ok echoed %d bytes sha256=%s", 1<<20, hex.EncodeToString(sum[:]))
	assert.Equal(t, want, s.waitLog("daemon: probe echo-proxy=", time.Minute), "through the proxy's CONNECT tunnel, both ways")
	assert.Equal(t, want, s.waitLog("daemon: probe echo-direct=", time.Minute), "with no proxy (the capture, or direct mode), both ways")
	vias := []string{"connect", "transparent"}
	if c.env.direct {
		// The workload holds the host's socket: no relay counts bytes,
		// so only the decision is an event.
		vias = vias[:1]
		s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == "direct" && e.Target == "echo.test:7" && e.Decision == "allowed"
		}, 30*time.Second, "direct allowed")
	}
	for _, via := range vias {
		allowed := s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == via && e.Target == "echo.test:7" && e.Decision == "allowed"
		}, 30*time.Second, via+" allowed")
		closed := s.waitFor(func(e api.Event) bool { return e.Event == api.KindEgressClosed && e.Conn == allowed.Conn }, 30*time.Second, via+" closed")
		if assert.NotNil(t, closed.BytesOut) && assert.NotNil(t, closed.BytesIn) {
			assert.Equal(t, int64(1<<20), *closed.BytesOut, "%s: the close event counts the bytes out", via)
			assert.Equal(t, int64(1<<20), *closed.BytesIn, "%s: and in", via)
		}
		assert.Empty(t, closed.Code, "%s closed cleanly", via)
	}
	carrier := carrierOf(s.stderr.String())
	t.Logf("%s: carried on the %s", c.row.name, carrier)
	if c.env.carrier != "" {
		assert.Equal(t, c.env.carrier, carrier, "the carrier this provider's transport allows")
	}
	switch carrier {
	case carrierFD:
		assert.Contains(t, s.stderr.String(), "handing=true", "the fd channel takes the workload's own sockets")
		pairEndsReachNothingElse(t, c)
	case carrierHand:
		// A shim that cannot make pairs (not root) still takes the
		// workload's own sockets: both vias above were handed.
		assert.Contains(t, s.stderr.String(), "handing=true", "the hand-only channel takes the workload's own sockets")
		assert.Contains(t, s.stderr.String(), "data_connections=true", "and what cannot be handed goes as data connections")
	}
}

// pairEndsReachNothingElse opens a forward into a sandbox of the row's
// (on the fd channel a forward arrives as the guest's end of a pair the
// host made) and looks at the descriptors the guest agent gained: each is
// a unix stream socket of the guest's own network namespace that cannot
// be disconnected or connected anywhere else.
func pairEndsReachNothingElse(t *testing.T, c *confCase) {
	name := uniqueName("conf-dp")
	spec := c.env.spec
	spec.name = name
	spec.bootstrap = confBootstrap(name, c.env.peer)
	spec.args = append(append([]string(nil), spec.args...), "--forward", "127.0.0.1:0="+strconv.Itoa(daemonPort))
	s := startShim(c.rowT, spec)
	s.t = t
	defer func() {
		s.signal(syscall.SIGTERM)
		s.exit(30 * time.Second)
	}()
	fwd := s.waitFor(func(e api.Event) bool { return e.Event == api.KindForward && e.Message == "listening" }, c.env.bootTimeout, "forward listening")
	s.waitState(api.StateReady, c.env.bootTimeout)
	agent := 0
	for _, p := range sandboxProcs(s, name) {
		if p.comm == "oac-guest" {
			agent = p.pid
		}
	}
	require.NotZero(t, agent, "the guest agent is a host process")
	// The fd channel comes up beside the boot, not before ready: a
	// forward made before it is up is a stream of the session. Forward
	// until one arrives on the channel (the agent gains a unix socket),
	// within the channel's own set-up bound.
	var ends []int
	var conn net.Conn
	for deadline := time.Now().Add(protocol.DataChannelTimeout); ; {
		before := map[string]bool{}
		for _, ino := range socketInodes(t, agent) {
			before[ino] = true
		}
		var err error
		conn, err = net.Dial("tcp", fwd.Listen)
		require.NoError(t, err)
		// A request the daemon answers slowly enough: the connection stays.
		_, err = io.WriteString(conn, "GET /global/health HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		require.NoError(t, err, "the forward carries the daemon's answer")
		ends = ends[:0]
		for fd, ino := range socketInodes(t, agent) {
			if !before[ino] {
				ends = append(ends, fd)
			}
		}
		if hasUnixSocket(agent, ends) || time.Now().After(deadline) {
			break
		}
		conn.Close()
	}
	defer conn.Close()
	require.NotEmpty(t, ends, "the forward gave the guest agent its end of a pair")
	hostNS := nsInode(t, "/proc/self/ns/net")
	// A name that exists in the guest's network namespace, for the ends
	// to try: a reconnect that could work would reach it.
	gns, err := netns.Open(fmt.Sprintf("/proc/%d/ns/net", agent))
	require.NoError(t, err)
	defer gns.Close()
	lure := "@oac-conformance-" + name
	ln, err := gns.Listen("unix", lure)
	require.NoError(t, err)
	defer ln.Close()
	lured := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			lured <- struct{}{}
		}
	}()
	pidfd, err := unix.PidfdOpen(agent, 0)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	pairEnds := 0
	for _, fd := range ends {
		mine, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			continue // closed meanwhile
		}
		func() {
			defer unix.Close(mine)
			dom, _ := unix.GetsockoptInt(mine, unix.SOL_SOCKET, unix.SO_DOMAIN)
			typ, _ := unix.GetsockoptInt(mine, unix.SOL_SOCKET, unix.SO_TYPE)
			// Every socket the agent gained is of its own network
			// namespace: its end of the pair, and the TCP connection it
			// made to the daemon on the workload's loopback.
			nsfd, err := unix.IoctlRetInt(mine, unix.SIOCGSKNS)
			if assert.NoError(t, err) {
				var st unix.Stat_t
				require.NoError(t, unix.Fstat(nsfd, &st))
				unix.Close(nsfd)
				assert.NotEqual(t, hostNS, st.Ino, "descriptor %d (domain %d) was made in the guest's network namespace, not the host's", fd, dom)
			}
			if dom != unix.AF_UNIX {
				return
			}
			pairEnds++
			assert.Equal(t, unix.SOCK_STREAM, typ)
			assert.Error(t, connectUnspec(mine), "its end of the pair cannot be disconnected")
			err = unix.Connect(mine, &unix.SockaddrUnix{Name: lure})
			assert.ErrorIs(t, err, unix.EISCONN, "nor connected to another socket of the guest's namespace")
			t.Logf("descriptor %d: a reconnect attempt fails: %v", fd, err)
			assert.Error(t, unix.Connect(mine, &unix.SockaddrInet4{Port: 80, Addr: [4]byte{127, 0, 0, 1}}), "nor to an address of another family")
		}()
	}
	assert.NotZero(t, pairEnds, "the forward arrived as the guest's end of a pair")
	select {
	case <-lured:
		t.Error("an end of a pair reached the listener")
	case <-time.After(100 * time.Millisecond):
	}
}

// hasUnixSocket reports whether one of pid's descriptors fds is an
// AF_UNIX socket.
func hasUnixSocket(pid int, fds []int) bool {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(pidfd)
	for _, fd := range fds {
		mine, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			continue
		}
		dom, _ := unix.GetsockoptInt(mine, unix.SOL_SOCKET, unix.SO_DOMAIN)
		unix.Close(mine)
		if dom == unix.AF_UNIX {
			return true
		}
	}
	return false
}

// connectUnspec is connect(2) with an AF_UNSPEC address: how a connected
// socket is disconnected, where its kind allows it.
func connectUnspec(fd int) error {
	var sa [16]byte // sa_family 0: AF_UNSPEC
	_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa)))
	if errno != 0 {
		return errno
	}
	return nil
}

// socketInodes maps pid's socket descriptors to their inodes.
func socketInodes(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[int]string{}
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(l, "socket:") {
			continue
		}
		fd, _ := strconv.Atoi(e.Name())
		m[fd] = l
	}
	return m
}

// nsInode returns the inode of a namespace file.
func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	return st.Ino
}
