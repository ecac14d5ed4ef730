//go:build linux

package selfreport

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// dialEnv makes the test binary a workload that reports what socketDoor
// says of a path (the child of TestSocketOutsidePidNamespace).
const dialEnv = "SELFREPORT_TEST_DIAL"

func TestMain(m *testing.M) {
	if p := os.Getenv(dialEnv); p != "" {
		_, pid, err := dialPeer(p)
		fmt.Printf("pid=%d err=%v door=%s\n", pid, err, socketDoor(p, nil))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func shortTemp(t *testing.T) string {
	t.Helper()
	// t.TempDir's paths can be longer than a socket address allows.
	d, err := os.MkdirTemp("", "sr-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestDialPeer(t *testing.T) {
	d := shortTemp(t)
	for _, c := range []struct {
		network string
		typ     int
	}{{"unix", unix.SOCK_STREAM}, {"unixpacket", unix.SOCK_SEQPACKET}} {
		p := filepath.Join(d, c.network)
		ln, err := net.Listen(c.network, p)
		require.NoError(t, err)
		defer ln.Close()
		typ, pid, err := dialPeer(p)
		require.NoError(t, err, c.network)
		assert.Equal(t, c.typ, typ, c.network)
		assert.Equal(t, int32(os.Getpid()), pid, "%s: a server of this pid namespace has its pid", c.network)
		assert.Equal(t, closed, peerOutside(p, nil), c.network)
		assert.Equal(t, "", socketDoor(p, nil), c.network)
	}

	dg := filepath.Join(d, "dgram")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: dg, Net: "unixgram"})
	require.NoError(t, err)
	defer pc.Close()
	typ, _, err := dialPeer(dg)
	require.NoError(t, err)
	assert.Equal(t, unix.SOCK_DGRAM, typ)
	assert.Equal(t, closed, peerOutside(dg, func() bool { return true }), "a datagram server in this network namespace")
	assert.Equal(t, outside, peerOutside(dg, func() bool { return false }), "a datagram server of another network namespace")
	assert.Equal(t, "", socketDoor(dg, netUnix()), "this process's socket is listed in /proc/self/net/unix")

	// A socket file nobody listens on any more.
	stale := filepath.Join(d, "stale")
	ln, err := net.Listen("unix", stale)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	_, _, err = dialPeer(stale)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.Equal(t, "", socketDoor(stale, nil))
	_, _, err = dialPeer(filepath.Join(d, "absent"))
	assert.Error(t, err)

	// A path too long for sockaddr_un is reached through a descriptor.
	long := filepath.Join(d, strings.Repeat("l", 60), strings.Repeat("m", 60))
	require.NoError(t, os.MkdirAll(filepath.Dir(long), 0o755))
	wd, _ := os.Getwd()
	require.NoError(t, os.Chdir(filepath.Dir(long)))
	lln, err := net.Listen("unix", filepath.Base(long))
	require.NoError(t, os.Chdir(wd))
	require.NoError(t, err)
	defer lln.Close()
	assert.Equal(t, "", socketDoor(long, nil), "connected, and its server is this process")
}

// A server outside the workload's pid namespace (the workload runs in a
// new one, which a user namespace of its own allows without root) is
// outside: its pid reads 0.
func TestSocketOutsidePidNamespace(t *testing.T) {
	d := shortTemp(t)
	require.NoError(t, os.Chmod(d, 0o755))
	p := filepath.Join(d, "host.sock")
	ln, err := net.Listen("unix", p)
	require.NoError(t, err)
	defer ln.Close()
	require.NoError(t, os.Chmod(p, 0o777))
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), dialEnv+"="+p)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("no user and pid namespace for the workload here: %v", err)
	}
	assert.Equal(t, "pid=0 err=<nil> door=host socket "+p+"\n", string(out))
}

func TestWalk(t *testing.T) {
	d := shortTemp(t)
	deep := d
	for i := 0; i < walkDepth+2; i++ {
		deep = filepath.Join(deep, "d")
	}
	require.NoError(t, os.MkdirAll(deep, 0o755))
	sock := filepath.Join(d, "d", "s.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	// A symlink to a directory is not followed.
	other := shortTemp(t)
	ln2, err := net.Listen("unix", filepath.Join(other, "t.sock"))
	require.NoError(t, err)
	defer ln2.Close()
	require.NoError(t, os.Symlink(other, filepath.Join(d, "link")))

	var sockets []string
	n, complete := walk(d, func(p string, typ fs.FileMode) {
		if typ&fs.ModeSocket != 0 {
			sockets = append(sockets, p)
		}
		assert.False(t, strings.HasPrefix(p, filepath.Join(d, "link")+"/"), "below a symlink: %s", p)
	})
	assert.Equal(t, []string{sock}, sockets)
	assert.False(t, complete, "deeper than the bound")
	assert.Equal(t, walkDepth+2, n, "d/ x6, the socket, the link: the depth bound stops the rest")

	wide := shortTemp(t)
	for i := 0; i < walkEntries+10; i++ {
		f, err := os.Create(filepath.Join(wide, "f"+strconv.Itoa(i)))
		require.NoError(t, err)
		f.Close()
	}
	n, complete = walk(wide, func(string, fs.FileMode) {})
	assert.Equal(t, walkEntries, n)
	assert.False(t, complete)

	n, complete = walk(filepath.Join(d, "link"), func(string, fs.FileMode) { t.Error("a root that is a symlink is not walked") })
	assert.Equal(t, 0, n)
	assert.True(t, complete)
}

// ScanDoors runs wherever the tests run (what it finds depends on the
// machine): quick, and its findings sorted, once each.
func TestScanDoors(t *testing.T) {
	sc := ScanDoors()
	t.Logf("took %s, %d entries, bounded in %v, %d finding(s)", sc.Took, sc.Entries, sc.Truncated, len(sc.Findings))
	for _, f := range sc.Findings {
		t.Log(f)
	}
	assert.Less(t, sc.Took, 2*time.Second)
	assert.True(t, sort.StringsAreSorted(sc.Findings))
	assert.Equal(t, Finish(sc.Findings), append([]string{}, sc.Findings...))
	assert.True(t, sort.StringsAreSorted(Doors()))
}

func TestPathState(t *testing.T) {
	d := shortTemp(t)
	empty := filepath.Join(d, "empty")
	full := filepath.Join(d, "full")
	require.NoError(t, os.Mkdir(empty, 0o755))
	require.NoError(t, os.Mkdir(full, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(full, "x"), []byte("x"), 0o644))
	mask := filepath.Join(d, "mask")
	require.NoError(t, os.WriteFile(mask, nil, 0o000))
	exe := filepath.Join(d, "init")
	require.NoError(t, os.WriteFile(exe, []byte("\x7fELF"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(d, "nothing"), filepath.Join(d, "dangling")))
	require.NoError(t, os.Symlink(full, filepath.Join(d, "link")))
	sock := filepath.Join(d, "s")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()

	for _, c := range []struct {
		path string
		door bool
		why  string
	}{
		{empty, false, "empty directory"},
		{full, true, ""},
		{mask, false, "empty file"},
		{exe, true, ""},
		{filepath.Join(d, "dangling"), false, "dangling symlink"},
		{filepath.Join(d, "link"), true, ""},
		{sock, true, ""},
		{"/dev/null", true, ""},
	} {
		door, why := PathDoor(pathState(c.path))
		assert.Equal(t, c.door, door, c.path)
		assert.Equal(t, c.why, why, c.path)
	}
}
