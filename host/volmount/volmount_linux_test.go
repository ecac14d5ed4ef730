package volmount

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestMain doubles as the guest's agent: with OAC_VOLMOUNT_GUEST set, the
// test binary runs inside a user and mount namespace of its own (as a
// bwrap guest does), mounts a tmpfs at /mnt with a directory home in it,
// connects to the socket the variable names and says "ready"; then, for
// each line on its stdin, it runs that step and answers.
func TestMain(m *testing.M) {
	if sock := os.Getenv("OAC_VOLMOUNT_GUEST"); sock != "" {
		os.Exit(guestMain(sock))
	}
	os.Exit(m.Run())
}

func guestMain(sock string) int {
	if err := unix.Mount("guest", "/mnt", "tmpfs", 0, ""); err != nil {
		fmt.Println("mount:", err)
		return 1
	}
	if err := os.Mkdir("/mnt/home", 0o755); err != nil {
		fmt.Println(err)
		return 1
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "read":
			b, err := os.ReadFile("/mnt/home/from-host")
			fmt.Printf("%q %v\n", b, err)
		case "write":
			fmt.Println(os.WriteFile("/mnt/home/from-guest", []byte("written\n"), 0o644))
		case "list":
			ents, err := os.ReadDir("/mnt/home")
			fmt.Println(len(ents), err)
		}
	}
	return 0
}

type guest struct {
	conn net.Conn
	in   io.Writer
	out  *bufio.Scanner
}

func (g *guest) ask(t *testing.T, step string) string {
	t.Helper()
	_, err := fmt.Fprintln(g.in, step)
	require.NoError(t, err)
	require.True(t, g.out.Scan(), "the guest's answer to %s", step)
	return g.out.Text()
}

func startGuest(t *testing.T) *guest {
	t.Helper()
	if !Supported() {
		t.Skip("volumes at claim need root (CAP_SYS_ADMIN): run the tests as root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare (apt-get install util-linux)")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	cmd := exec.Command(unshare, "--user", "--map-root-user", "--mount", "--propagation", "private", self)
	cmd.Env = append(os.Environ(), "OAC_VOLMOUNT_GUEST="+sock)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	conn, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	g := &guest{conn: conn, in: in, out: bufio.NewScanner(out)}
	require.True(t, g.out.Scan())
	require.Equal(t, "ready", g.out.Text())
	return g
}

func mountinfo(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	return string(b)
}

func TestAVolumeAppearsInTheGuestAndNowhereElse(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(host, "from-host"), []byte("hello"), 0o644))
	g := startGuest(t)
	before := mountinfo(t)
	a, err := Attach(g.conn, []Volume{{Guest: "/mnt/home", Host: host}})
	a.Release()
	require.NoError(t, err)
	assert.Equal(t, before, mountinfo(t), "no mount in the shim's namespace")
	assert.Equal(t, `"hello" <nil>`, g.ask(t, "read"), "the guest reads the host's file")
	assert.Equal(t, "<nil>", g.ask(t, "write"))
	b, err := os.ReadFile(filepath.Join(host, "from-guest"))
	require.NoError(t, err)
	assert.Equal(t, "written\n", string(b), "the guest writes into the host's directory")
}

func TestDetachLeavesTheGuestsOwnDirectory(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(host, "from-host"), []byte("hello"), 0o644))
	g := startGuest(t)
	a, err := Attach(g.conn, []Volume{{Guest: "/mnt/home", Host: host}})
	require.NoError(t, err)
	assert.Equal(t, "1 <nil>", g.ask(t, "list"))
	require.NoError(t, a.Detach())
	assert.Equal(t, "0 <nil>", g.ask(t, "list"), "the guest's empty directory again")
}

func TestAllOrNothing(t *testing.T) {
	host := t.TempDir()
	g := startGuest(t)
	_, err := Attach(g.conn, []Volume{{Guest: "/mnt/home", Host: host}, {Guest: "/mnt/missing", Host: host}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/mnt/missing")
	assert.Equal(t, "0 <nil>", g.ask(t, "list"), "the first volume was taken back")
}

func TestAGuestSymlinkIsNotFollowed(t *testing.T) {
	host := t.TempDir()
	g := startGuest(t)
	pidfd, err := PeerPidfd(g.conn)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	// /mnt/link -> /mnt/home inside the guest: made from the host's side
	// through the guest's root, as a guest root would.
	require.NoError(t, os.Symlink("/mnt/home", fmt.Sprintf("/proc/%d/root/mnt/link", pidOfT(t, pidfd))))
	_, err = AttachPidfd(pidfd, []Volume{{Guest: "/mnt/link", Host: host}})
	require.Error(t, err, "a symlink on the guest's side is refused")
	assert.Equal(t, "0 <nil>", g.ask(t, "list"))
}

func TestAGoneAgentIsAnError(t *testing.T) {
	g := startGuest(t)
	pidfd, err := PeerPidfd(g.conn)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	require.NoError(t, unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0))
	var si unix.Siginfo
	_ = unix.Waitid(unix.P_PIDFD, pidfd, &si, unix.WEXITED|unix.WNOWAIT, nil)
	_, err = AttachPidfd(pidfd, []Volume{{Guest: "/mnt/home", Host: t.TempDir()}})
	require.Error(t, err)
}

func pidOfT(t *testing.T, pidfd int) int {
	pid, err := pidOf(pidfd)
	require.NoError(t, err)
	return pid
}
