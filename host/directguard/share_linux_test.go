package directguard

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSharesTakeAtMostHalfTheRange(t *testing.T) {
	for _, c := range []struct {
		lo, hi, size  int
		capped, count int
		what          string
	}{
		{32768, 60999, 1024, 1024, 13, "Linux's default range"},
		{1024, 65535, 1024, 1024, 31, "the widest range"},
		{40000, 40999, 1024, 500, 1, "a share is at most half the range"},
		{40000, 40999, 100, 100, 5, ""},
		{40000, 40000, 1024, 0, 0, "a range of one port has no share"},
		{40000, 40001, 1024, 1, 1, ""},
	} {
		capped, count := slots(c.lo, c.hi, c.size)
		assert.Equal(t, c.capped, capped, c.what)
		assert.Equal(t, c.count, count, c.what)
		assert.LessOrEqual(t, capped*count, (c.hi-c.lo+1)/2, "the host keeps half")
	}
}

func TestThePortRangeIsParsedStrictly(t *testing.T) {
	lo, hi, ok := parsePortRange("32768\t60999\n")
	assert.True(t, ok)
	assert.Equal(t, [2]int{32768, 60999}, [2]int{lo, hi})
	for _, bad := range []string{"", "1", "1 2 3", "0 10", "10 5", "1 65536", "a b"} {
		_, _, ok := parsePortRange(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func portOf(c net.Conn) int { return c.LocalAddr().(*net.TCPAddr).Port }

func TestTwoGuardsGetDisjointSharesAndTheirSocketsStayInside(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	a := openGuard(t, Config{ShareDir: dir})
	b := openGuard(t, Config{ShareDir: dir})
	alo, ahi := a.Share()
	blo, bhi := b.Share()
	assert.Equal(t, DefaultShareSize-1, ahi-alo)
	assert.Equal(t, DefaultShareSize-1, bhi-blo)
	assert.True(t, ahi < blo || bhi < alo, "disjoint: %d-%d and %d-%d", alo, ahi, blo, bhi)

	l, up := listen(t, "127.0.0.1")
	for range 20 {
		for _, g := range []*Guard{a, b} {
			c := dialLocked(t, g, up, true)
			lo, hi := g.Share()
			assert.True(t, portOf(c) >= lo && portOf(c) <= hi, "port %d in %d-%d", portOf(c), lo, hi)
			s, err := l.Accept()
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
		}
	}
}

func TestWhenEveryShareIsTakenOpenSaysSo(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	// A share as wide as the range is capped at half of it: one slot.
	first, err := Open(Config{ShareDir: dir, ShareSize: 65536})
	require.NoError(t, err)
	_, err = Open(Config{ShareDir: dir, ShareSize: 65536})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "every port share")
	assert.Contains(t, err.Error(), "in use by other sandboxes")
	lo, hi := first.Share()
	require.NoError(t, first.Close())
	again := openGuard(t, Config{ShareDir: dir, ShareSize: 65536})
	alo, ahi := again.Share()
	assert.Equal(t, [2]int{lo, hi}, [2]int{alo, ahi}, "a closed guard's share is free again")
}

func TestAKilledProcesssShareIsFreeAgain(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	cmd := childCommand("share-holder", "SHARE_DIR="+dir, "SHARE_SIZE=65536")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan())
	var lo, hi int
	_, err = fmt.Sscanf(sc.Text(), "share %d %d", &lo, &hi)
	require.NoError(t, err, sc.Text())

	_, err = Open(Config{ShareDir: dir, ShareSize: 65536})
	require.ErrorContains(t, err, "every port share", "the child holds the only share")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, cmd.Wait())
	g := openGuard(t, Config{ShareDir: dir, ShareSize: 65536})
	glo, ghi := g.Share()
	assert.Equal(t, [2]int{lo, hi}, [2]int{glo, ghi}, "the kernel dropped the dead process's lock")
}

// In a network namespace of its own (the sysctls are the namespace's):
// the kernel picks the share's ports and skips the reserved ones.
func TestASharesSocketsNeverTakeAReservedPort(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	var g *Guard
	var err error
	shares := t.TempDir()
	ns.run(func() {
		if err = os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40999"), 0); err != nil {
			return
		}
		// All of the share but its last five ports.
		if err = os.WriteFile("/proc/sys/net/ipv4/ip_local_reserved_ports", []byte("40000-40094"), 0); err != nil {
			return
		}
		g, err = Open(Config{ShareDir: shares, ShareSize: 100})
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	lo, hi := g.Share()
	require.Equal(t, [2]int{40000, 40099}, [2]int{lo, hi})

	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			// On a port outside the ephemeral range, which it would
			// otherwise take a port of.
			var l net.Listener
			var err error
			ns.run(func() { l, err = net.Listen("tcp", net.JoinHostPort(addr, "8080")) })
			require.NoError(t, err)
			defer l.Close()
			up := l.Addr().(*net.TCPAddr).AddrPort()
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			ports := map[int]bool{}
			var last error
			ns.run(func() {
				d := net.Dialer{Timeout: 10 * time.Second, Control: func(network, _ string, c syscall.RawConn) error {
					return g.Lock(network, up, c)
				}}
				for range 6 {
					c, err := d.Dial("tcp", up.String())
					if err != nil {
						last = err
						break
					}
					conns = append(conns, c)
				}
			})
			for _, c := range conns {
				ports[portOf(c)] = true
			}
			assert.Equal(t, map[int]bool{40095: true, 40096: true, 40097: true, 40098: true, 40099: true}, ports, "exactly the share's unreserved ports")
			var errno syscall.Errno
			require.True(t, errors.As(last, &errno), "%v", last)
			assert.Equal(t, unix.EADDRNOTAVAIL, errno, "a sixth connection finds no port: the kernel does not leave the share")
		})
	}
}

func TestIPLocalPortRangeWorksOnAnIPv6Socket(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	_, up := listen(t, "::1")
	c := dialLocked(t, g, up, false)
	lo, hi := g.Share()
	assert.True(t, portOf(c) >= lo && portOf(c) <= hi)
	assert.True(t, netip.MustParseAddrPort(c.LocalAddr().String()).Addr().Is6())
}
