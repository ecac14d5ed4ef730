package egress

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// changeAddr adds or deletes a/32 on the interface index (rtnetlink).
func changeAddr(t *testing.T, typ netlink.HeaderType, index int, a netip.Addr) {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	require.NoError(t, err)
	defer c.Close()
	msg := []byte{unix.AF_INET, 32, 0, unix.RT_SCOPE_UNIVERSE, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(msg[4:], uint32(index))
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.IFA_LOCAL, a.AsSlice())
	ae.Bytes(unix.IFA_ADDRESS, a.AsSlice())
	attrs, err := ae.Encode()
	require.NoError(t, err)
	flags := netlink.Request | netlink.Acknowledge
	if typ == unix.RTM_NEWADDR {
		flags |= netlink.Create | netlink.Excl
	}
	_, err = c.Execute(netlink.Message{Header: netlink.Header{Type: typ, Flags: flags}, Data: append(msg, attrs...)})
	require.NoError(t, err)
}

// The watcher follows address changes: run in a network namespace of its
// own (a child of this test binary), an address added after the watcher
// started is the host's within moments, and no longer once deleted.
func TestTheWatcherFollowsAddressesAddedAndDeleted(t *testing.T) {
	if os.Getenv("OAC_EGRESS_NETNS_CHILD") == "1" {
		watcherChild(t)
		return
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("missing with CI=true: root, for a network namespace of the test's own")
		}
		t.Skip("skipped: needs root for a network namespace of the test's own")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTheWatcherFollowsAddressesAddedAndDeleted$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "OAC_EGRESS_NETNS_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "--- PASS: TestTheWatcherFollowsAddressesAddedAndDeleted")
	t.Logf("in its own network namespace:\n%s", out)
}

func watcherChild(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	a := netip.MustParseAddr("93.184.216.77")
	sys := SystemHostAddrs()
	_, isLinux := sys.(*linuxAddrs)
	require.True(t, isLinux, "netlink watcher in use")
	_, own := sys.Owner(a)
	require.False(t, own)
	changeAddr(t, unix.RTM_NEWADDR, lo.Index, a)
	assert.Eventually(t, func() bool { _, own := sys.Owner(a); return own }, 5*time.Second, time.Millisecond, "added")
	changeAddr(t, unix.RTM_DELADDR, lo.Index, a)
	assert.Eventually(t, func() bool { _, own := sys.Owner(a); return !own }, 5*time.Second, time.Millisecond, "deleted")
}
