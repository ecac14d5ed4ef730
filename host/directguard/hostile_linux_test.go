package directguard

import (
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// scene is a direct connection in the hands of a hostile guest root: the
// upstream it was allowed to, another listener of the host's it must not
// reach, and a capture of what the host sends on loopback.
type scene struct {
	t        *testing.T
	g        *Guard
	ns       *netnsThread // nil: the host's own namespace
	upstream netip.AddrPort
	upside   net.Conn // the upstream's end
	other    netip.AddrPort
	local    netip.AddrPort // the handed socket's own address
	cap      *capture
	guest    *guestRoot
}

// newScene connects to an upstream on loopback as the egress broker does
// in direct mode (locked; sealed when seal is set), hands the socket to a
// guest root and keeps no copy of it.
func newScene(t *testing.T, seal bool) *scene {
	t.Helper()
	return newSceneIn(t, seal, nil, "127.0.0.1")
}

// newSceneIn is newScene in ns, on loopback address lo.
func newSceneIn(t *testing.T, seal bool, ns *netnsThread, lo string) *scene {
	t.Helper()
	needRoot(t)
	s := &scene{t: t, g: openGuard(t, Config{}), ns: ns}
	var up *net.TCPListener
	up, s.upstream = listenIn(t, ns, lo)
	_, s.other = listenIn(t, ns, lo)
	c := dialLockedIn(t, ns, s.g, s.upstream, seal)
	s.local = c.LocalAddr().(*net.TCPAddr).AddrPort()
	var err error
	s.upside, err = up.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { s.upside.Close() })
	f, err := c.File()
	require.NoError(t, err)
	require.NoError(t, c.Close())
	s.guest = startGuestRoot(t, f)
	require.NoError(t, f.Close())
	require.Equal(t, "ok", s.guest.do("caps"), "the guest root has every capability in its own namespaces")
	require.Equal(t, "ok", s.guest.do("nonblock 3"))
	// From here on: what the handshake sent is behind us.
	s.cap = newCapture(t, ns)
	return s
}

func (s *scene) inShare(port uint16) bool {
	lo, hi := s.g.Share()
	return int(port) >= lo && int(port) <= hi
}

func TestASealedSocketCannotBeReconnectedAnywhere(t *testing.T) {
	s := newScene(t, true)
	assert.Equal(t, "ok", s.guest.do("disconnect 3"), "the kernel lets anyone disconnect a TCP socket")
	assert.Equal(t, "EPERM", s.guest.do("connect 3 %s", s.other), "another of the host's listeners")
	assert.Equal(t, "EPERM", s.guest.do("connect 3 %s", s.upstream), "even its own upstream, once disconnected")
	assert.Equal(t, "EPERM", s.guest.do("connect 3 %s", nowhere), "anywhere the host routes")
	assert.Equal(t, "EPERM", s.guest.do("fastopen 3 %s", s.other), "a send that connects")

	seen := s.cap.fence(s.other)
	assert.Zero(t, synsTo(seen, s.other.Port()), "no SYN reached the other listener")
	assert.Zero(t, synsToAny(seen, s.upstream, nowhere), "nor anywhere else")
}

// nowhere is an address the host routes (over loopback, where the
// capture sees it) and nothing listens on.
var nowhere = netip.MustParseAddrPort("127.0.0.3:443")

func TestAnUnsealedSocketCanBeReconnectedSoTheAttackIsReal(t *testing.T) {
	s := newScene(t, false)
	assert.Equal(t, "ok", s.guest.do("disconnect 3"))
	assert.Equal(t, "EINPROGRESS", s.guest.do("connect 3 %s", s.other), "nothing refuses an unsealed socket")
	seen := s.cap.fence(s.other)
	require.Positive(t, synsTo(seen, s.other.Port()), "the capture sees the SYN the guard exists to stop")
	for _, p := range seen {
		if p.dst == s.other {
			assert.True(t, s.inShare(p.src.Port()), "reconnected, the socket still takes a port of the share (%v)", p.src)
		}
	}
}

func TestASealedSocketCannotBeBound(t *testing.T) {
	s := newScene(t, true)
	assert.Equal(t, "EPERM", s.guest.do("bind 3"), "connected")
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	assert.Equal(t, "EPERM", s.guest.do("bind 3"), "disconnected")
}

func TestAnUnsealedSocketCanBeBoundOnceDisconnected(t *testing.T) {
	s := newScene(t, false)
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	assert.Equal(t, "ok", s.guest.do("bind 3"))
}

func TestASealedSocketsReachingOptionsAreRefused(t *testing.T) {
	s := newScene(t, true)
	for _, r := range strings.Fields(s.guest.do("sockopts 3")) {
		name, got, _ := strings.Cut(r, "=")
		assert.Equal(t, "EPERM", got, name)
	}
	// The kernel refuses these itself: guest root has no capability in
	// the host's namespace. Asserted so that a regression shows.
	assert.Equal(t, "EPERM", s.guest.do("mark 3"), "SO_MARK needs CAP_NET_ADMIN or CAP_NET_RAW in the host's namespace")
	assert.Equal(t, "EPERM", s.guest.do("repair 3"), "TCP_REPAIR needs CAP_NET_ADMIN in the host's namespace")
	assert.Equal(t, "EPERM", s.guest.do("skns 3"), "SIOCGSKNS (the host's namespace itself) needs CAP_NET_ADMIN there")
}

func TestAnUnsealedSocketsOptionsAreNotRefusedSoTheRefusalIsTheGuards(t *testing.T) {
	s := newScene(t, false)
	for _, r := range strings.Fields(s.guest.do("sockopts 3")) {
		name, got, _ := strings.Cut(r, "=")
		assert.NotEqual(t, "EPERM", got, name)
	}
	assert.Equal(t, "EPERM", s.guest.do("mark 3"))
	assert.Equal(t, "EPERM", s.guest.do("repair 3"))
}

func TestAnUnsealedSocketsFastOpenSendConnects(t *testing.T) {
	s := newScene(t, false)
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	got := s.guest.do("fastopen 3 %s", s.other)
	assert.Contains(t, []string{"ok", "EINPROGRESS"}, got)
	assert.Positive(t, synsTo(s.cap.fence(s.other), s.other.Port()), "its SYN left")
}

func TestManyThreadsRacingToReconnectASealedSocketSendNoSYN(t *testing.T) {
	s := newScene(t, true)
	const threads, n = 4, 2000
	got := s.guest.do("race 3 %d %d %s", threads, n, s.other)
	counts := map[string]int{}
	for _, f := range strings.Fields(got) {
		k, v, _ := strings.Cut(f, "=")
		counts[k], _ = strconv.Atoi(v)
	}
	assert.Equal(t, threads*n, counts["connect:EPERM"], got)
	assert.Equal(t, threads*n, counts["fastopen:EPERM"], got)
	assert.Equal(t, threads*n, counts["disconnect:ok"], got)
	seen := s.cap.fence(s.other)
	assert.Zero(t, synsTo(seen, s.other.Port()))
	assert.Zero(t, synsToAny(seen, s.upstream))
}

// A disconnected socket may not listen (the kernel refuses one that was
// connected); should a kernel allow it, the peer filter admits no one
// else. TestASealedListenerAdmitsOnlyItsPeerAndWhatItAcceptsIsSealed
// covers what such a listener would do.
func TestASealedSocketCannotListenOnceDisconnected(t *testing.T) {
	s := newScene(t, true)
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	got := s.guest.do("listen 3")
	if got == "EINVAL" {
		return
	}
	require.True(t, strings.HasPrefix(got, "ok "), got)
	port, _ := strconv.Atoi(strings.TrimPrefix(got, "ok "))
	assert.True(t, s.inShare(uint16(port)), "it listens inside the share: %d", port)
	drops := strings.TrimPrefix(s.guest.do("waitdrops 3 -1"), "ok ")
	stranger, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(stranger)
	assert.ErrorIs(t, unix.Connect(stranger, sockaddrOf(netip.AddrPortFrom(s.local.Addr(), uint16(port)))), unix.EINPROGRESS)
	assert.True(t, strings.HasPrefix(s.guest.do("waitdrops 3 %s", drops), "ok "), "the listener dropped the stranger's SYN")
	assert.Equal(t, "EAGAIN", s.guest.do("accept 3"), "nothing to accept")
}

// A sealed socket that listens (marked here before it connected, as no
// kernel lets a connected one listen again): the filter admits only its
// peer, and the sockets it accepts are sealed too.
func TestASealedListenerAdmitsOnlyItsPeerAndWhatItAcceptsIsSealed(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	// An upstream that can also connect from its own port (SO_REUSEPORT),
	// as a hostile upstream would.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	l, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	upstream := l.Addr().(*net.TCPAddr).AddrPort()
	_, other := listen(t, "127.0.0.1")

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, g.Lock("tcp4", upstream, rc))
	require.NoError(t, g.m.Update(uint32(fd), sealValueFor(upstream.Addr()), ebpf.UpdateAny))
	require.NoError(t, unix.Listen(fd, 8))
	listening := netip.AddrPortFrom(upstream.Addr(), uint16(localPort(fd)))
	lo, hi := g.Share()
	assert.True(t, int(listening.Port()) >= lo && int(listening.Port()) <= hi, "it listens inside the share: %v", listening)

	guest := startGuestRoot(t, f)
	require.Equal(t, "ok", guest.do("nonblock 3"))

	// Anyone else: the SYN is dropped (the listener counts it) and
	// nothing is accepted.
	drops := strings.TrimPrefix(guest.do("waitdrops 3 -1"), "ok ")
	stranger, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(stranger)
	assert.ErrorIs(t, unix.Connect(stranger, sockaddrOf(listening)), unix.EINPROGRESS)
	assert.True(t, strings.HasPrefix(guest.do("waitdrops 3 %s", drops), "ok "), "the listener dropped the stranger's SYN")
	assert.Equal(t, "EAGAIN", guest.do("accept 3"), "nothing to accept")
	info, err := unix.GetsockoptTCPInfo(stranger, unix.IPPROTO_TCP, unix.TCP_INFO)
	require.NoError(t, err)
	assert.Equal(t, uint8(2), info.State, "the stranger is still in SYN_SENT")

	// The peer (from its own address and port) gets through; the socket
	// accepted carries the seal.
	peer, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(peer)
	require.NoError(t, unix.SetsockoptInt(peer, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1))
	require.NoError(t, unix.Bind(peer, sockaddrOf(upstream)))
	require.NoError(t, unix.Connect(peer, sockaddrOf(listening)))
	got := guest.do("accept 3")
	require.True(t, strings.HasPrefix(got, "ok "), got)
	child := strings.TrimPrefix(got, "ok ")
	assert.Equal(t, "ok "+upstream.String(), guest.do("peer %s", child))

	// Abort finds it by its seal (its cookie was never recorded).
	n, err := g.Abort()
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the listener and the socket it accepted")
	require.NoError(t, unix.SetsockoptTimeval(peer, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}))
	_, err = unix.Read(peer, make([]byte, 1))
	assert.ErrorIs(t, err, unix.ECONNRESET, "the peer got a reset")

	require.Equal(t, "ok", guest.do("disconnect %s", child))
	assert.Equal(t, "EPERM", guest.do("connect %s %s", child, other), "the accepted socket is sealed too")
	assert.Equal(t, "EPERM", guest.do("bind %s", child))
	for _, r := range strings.Fields(guest.do("sockopts %s", child)) {
		name, got, _ := strings.Cut(r, "=")
		assert.Equal(t, "EPERM", got, name)
	}
}

// The compat tests: a 32-bit setsockopt never runs the cgroup setsockopt
// program, so a guest root can set a sealed socket's reaching options
// that way. The egress program makes them reach nothing.

func compatScene(t *testing.T, seal bool) *scene {
	t.Helper()
	needRoot(t)
	if err := haveCompat(t); err != nil {
		t.Skip(err)
	}
	s := newScene(t, seal)
	require.Equal(t, "ok", s.guest.do("compat-sockopt 3 %d %d 01000000", unix.IPPROTO_TCP, unix.TCP_NODELAY))
	return s
}

// srcRoute is IP_OPTIONS' loose source route through hop (then the
// peer), padded to 8 bytes.
func srcRoute(hop string) string {
	a := netip.MustParseAddr(hop).As4()
	return hex.EncodeToString([]byte{0x83, 7, 4, a[0], a[1], a[2], a[3], 0})
}

// segmentRoute is IPV6_RTHDR's segment routing header (type 4) with one
// segment, hop: the segment goes there instead of to its peer.
func segmentRoute(hop netip.Addr) string {
	b := make([]byte, 24)
	b[1] = 2 // length in 8 bytes, past the first 8
	b[2] = 4 // type: segment routing
	a := hop.As16()
	copy(b[8:], a[:])
	return hex.EncodeToString(b)
}

func TestTheKernelRefusesAGuestRootAnIPv4SourceRouteEvenByACompatCall(t *testing.T) {
	s := compatScene(t, false)
	assert.Equal(t, "EPERM", s.guest.do("compat-sockopt 3 %d %d %s", unix.IPPROTO_IP, unix.IP_OPTIONS, srcRoute("127.0.0.2")), "a source route takes a capability in the host's namespace")
}

func TestACompatSegmentRouteOnASealedSocketSendsNothingAstray(t *testing.T) {
	for _, seal := range []bool{true, false} {
		t.Run(map[bool]string{true: "sealed", false: "unsealed"}[seal], func(t *testing.T) {
			needRoot(t)
			if err := haveCompat(t); err != nil {
				t.Skip(err)
			}
			// In a namespace of its own, where the segment's hop can be
			// an address of lo.
			ns := newNetns(t)
			hop := netip.MustParseAddr("2001:db8::99")
			var err error
			ns.run(func() { err = addAddr6(hop) })
			require.NoError(t, err)
			s := newSceneIn(t, seal, ns, "::1")
			assert.Equal(t, "ok", s.guest.do("compat-sockopt 3 %d %d %s", unix.IPPROTO_IPV6, unix.IPV6_RTHDR, segmentRoute(hop)), "the cgroup hook never sees a compat setsockopt")
			require.Equal(t, "ok", s.guest.do("write 3 astray"))
			var toHop int
			for _, p := range s.cap.fence(s.other) {
				if p.src == s.local && p.dst.Addr() == hop {
					toHop++
				}
			}
			if seal {
				assert.Zero(t, toHop, "the egress program dropped every segment to the hop")
			} else {
				assert.Positive(t, toHop, "unsealed, the segment went to the hop")
			}
		})
	}
}

func TestASealedIPv6SocketCannotBeReconnectedAnywhere(t *testing.T) {
	s := newSceneIn(t, true, nil, "::1")
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	assert.Equal(t, "EPERM", s.guest.do("connect 3 %s", s.other))
	assert.Equal(t, "EPERM", s.guest.do("connect 3 [::ffff:127.0.0.1]:%d", s.other.Port()), "a v4-mapped address")
	assert.Equal(t, "EPERM", s.guest.do("bind 3"))
	seen := s.cap.fence(s.other)
	assert.Zero(t, synsTo(seen, s.other.Port()))
	assert.Zero(t, synsToAny(seen, s.upstream))
}

func TestACompatBindToDeviceOnASealedSocketStopsItsTraffic(t *testing.T) {
	for _, seal := range []bool{true, false} {
		t.Run(map[bool]string{true: "sealed", false: "unsealed"}[seal], func(t *testing.T) {
			s := compatScene(t, seal)
			assert.Equal(t, "ok", s.guest.do("compat-sockopt 3 %d %d %s", unix.SOL_SOCKET, unix.SO_BINDTODEVICE, hex.EncodeToString([]byte("lo\x00"))))
			require.Equal(t, "ok", s.guest.do("write 3 bound"))
			sent := between(s.cap.fence(s.other), s.local, s.upstream)
			if seal {
				assert.Empty(t, sent, "a sealed socket bound to a device sends nothing")
			} else {
				assert.NotEmpty(t, sent, "unsealed, it sends on the device it chose")
				b := make([]byte, 5)
				_, err := s.upside.Read(b)
				require.NoError(t, err)
				assert.Equal(t, "bound", string(b))
			}
		})
	}
}

func TestACompatConnectOfASealedSocketIsRefusedToo(t *testing.T) {
	s := compatScene(t, true)
	require.Equal(t, "ok", s.guest.do("disconnect 3"))
	assert.Equal(t, "EPERM", s.guest.do("compat-connect 3 %s", s.other), "the connect hook is in the protocol, under every entry")
	assert.Zero(t, synsTo(s.cap.fence(s.other), s.other.Port()))
}

func TestTheSealedSocketStillTalksToItsUpstream(t *testing.T) {
	s := newScene(t, true)
	require.Equal(t, "ok", s.guest.do("write 3 ping"))
	b := make([]byte, 4)
	_, err := s.upside.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(b))
}

// What the guard cannot refuse: no cgroup hook sees a socket's ioctls, and
// listing interfaces takes no capability. A guest root holding a sealed
// socket reads the names of the host's interfaces (its own namespace has
// only lo). Asserted so that the day it changes, the docs change too.
func TestAGuestRootCanStillListTheHostsInterfacesThroughASealedSocket(t *testing.T) {
	s := newScene(t, true)
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	var up []string // SIOCGIFCONF lists those with an IPv4 address
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		require.NoError(t, err)
		for _, a := range addrs {
			if p, ok := a.(*net.IPNet); ok && p.IP.To4() != nil {
				up = append(up, i.Name)
				break
			}
		}
	}
	if len(up) == 0 {
		t.Skip("the host has no interface but lo")
	}
	got := s.guest.do("ifconf 3")
	require.True(t, strings.HasPrefix(got, "ok "), got)
	for _, name := range up {
		assert.Contains(t, strings.Split(strings.TrimPrefix(got, "ok "), ","), name)
	}
}
