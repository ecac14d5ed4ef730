package dataplane

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/protocol"
)

// The probe is a hostile guest root in user, network and pid namespaces of
// its own (as bwrap makes them): it takes its end of an egress connection from
// the fd channel and tries to reach anything else with it.
// soPeerPIDFD is SO_PEERPIDFD (Linux 6.5).
const soPeerPIDFD = 77

const (
	probeEnv         = "OAC_DATAPLANE_PROBE_SOCKET"
	probeAbstractEnv = "OAC_DATAPLANE_PROBE_ABSTRACT"
	probeBindEnv     = "OAC_DATAPLANE_PROBE_BIND"
)

type probeReport struct {
	Err string `json:"err,omitempty"`
	// Carried: bytes went to the upstream and came back.
	Carried bool `json:"carried"`
	// Cookie of the end's network namespace, of a socket the guest made,
	// as SO_NETNS_COOKIE says.
	EndCookie, OwnCookie uint64
	// The errors of each attempt ("" for success).
	ConnectUnspec, ConnectHostName, ConnectOwnName, FreshConnectHostName, Bind, Listen, SendTo string
	// Interfaces SIOCGIFNAME names through the end.
	Interfaces []string
	// What a pid descriptor of the end's peer (SO_PEERPIDFD: the host's
	// process) allows: signalling it, taking its descriptors.
	PeerPIDFD, PeerSignal, PeerGetfd string
}

func probeMain() bool {
	path := os.Getenv(probeEnv)
	if path == "" {
		return false
	}
	rep := runProbe(path, os.Getenv(probeAbstractEnv), os.Getenv(probeBindEnv))
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	os.Exit(0)
	return true
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	var en unix.Errno
	if errors.As(err, &en) {
		return unix.ErrnoName(en)
	}
	return err.Error()
}

func runProbe(path, hostName, bindName string) (rep probeReport) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	defer c.Close()
	r := protocol.NewFDReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var ack protocol.Channel
	var ans protocol.Connected
	if err := protocol.WriteMessage(c, protocol.TypeChannel, protocol.Channel{Token: testToken}); err == nil {
		err = protocol.ReadMessage(r, protocol.MaxHeaderFrame, protocol.TypeChannel, &ack)
		if err == nil {
			err = protocol.WriteMessage(c, protocol.TypeConnect, protocol.Connect{ID: 1, Host: "up.test", Port: 80})
		}
		if err == nil {
			err = protocol.ReadMessage(r, protocol.MaxHeaderFrame, protocol.TypeConnected, &ans)
		}
		if err != nil {
			rep.Err = err.Error()
			return rep
		}
	}
	end, err := r.TakeConn()
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	defer end.Close()
	_ = end.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := end.Write([]byte("x")); err == nil {
		b := make([]byte, 1)
		_, err = io.ReadFull(end, b)
		rep.Carried = err == nil && b[0] == 'x'
	}
	rc, _ := end.SyscallConn()
	_ = rc.Control(func(u uintptr) {
		fd := int(u)
		rep.EndCookie, _ = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		// Disconnect (a TCP socket would be free to connect anywhere
		// after this), then connect again elsewhere.
		unspec := unix.RawSockaddr{Family: unix.AF_UNSPEC}
		if _, _, en := unix.Syscall(unix.SYS_CONNECT, u, uintptr(unsafe.Pointer(&unspec)), unsafe.Sizeof(unspec)); en != 0 {
			rep.ConnectUnspec = unix.ErrnoName(en)
		}
		rep.ConnectHostName = errText(unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + hostName}))
		// A listener of the guest's own, which exists: still no.
		if l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + hostName + "-guest", Net: "unix"}); err == nil {
			rep.ConnectOwnName = errText(unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + hostName + "-guest"}))
			l.Close()
		}
		rep.SendTo = errText(unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrUnix{Name: "@" + hostName}))
		rep.Bind = errText(unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + bindName}))
		rep.Listen = errText(unix.Listen(fd, 1))
		if pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPeerPIDFD); err != nil {
			rep.PeerPIDFD = errText(err)
		} else {
			rep.PeerSignal = errText(unix.PidfdSendSignal(pidfd, 0, nil, 0))
			got, err := unix.PidfdGetfd(pidfd, 0, 0)
			if err == nil {
				unix.Close(got)
			}
			rep.PeerGetfd = errText(err)
			unix.Close(pidfd)
		}
		for i := 1; i < 64; i++ {
			ifr, err := unix.NewIfreq("")
			if err != nil {
				break
			}
			ifr.SetUint32(uint32(i))
			if unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr) == nil {
				rep.Interfaces = append(rep.Interfaces, ifr.Name())
			}
		}
	})
	if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0); err == nil {
		rep.OwnCookie, _ = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		rep.FreshConnectHostName = errText(unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + hostName}))
		unix.Close(fd)
	}
	return rep
}

// Never a socket of the host's network namespace: the guest's end of a
// pair is a socket of the guest's own namespace, so it shows the guest's
// interfaces (only lo), binds names in the guest's abstract namespace, and,
// like any connected AF_UNIX stream socket, cannot be disconnected or
// connected anywhere else.
func TestTheGuestsEndIsASocketOfItsOwnNamespaceAndReachesNothingElse(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	suffix := strconv.Itoa(os.Getpid())
	hostName, bindName := "oac-test-host-"+suffix, "oac-test-bind-"+suffix
	hl, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + hostName, Net: "unix"})
	require.NoError(t, err, "a listener in the host's abstract namespace the guest must not reach")
	defer hl.Close()
	hostFD, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	require.NoError(t, err)
	hostCookie, _ := unix.GetsockoptUint64(hostFD, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	unix.Close(hostFD)

	exe := probeBinary(t)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = []string{probeEnv + "=" + h.path, probeAbstractEnv + "=" + hostName, probeBindEnv + "=" + bindName}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID,
		// Guest root is the host's own uid, as in a rootless sandbox: the
		// worst case for what a pid descriptor of the host allows.
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.Output()
	require.NoError(t, err, "probe: %s", out)
	var rep probeReport
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	t.Logf("probe: %+v", rep)
	require.Empty(t, rep.Err)
	assert.True(t, rep.Carried, "the end carries the connection it was made for")
	assert.Equal(t, rep.OwnCookie, rep.EndCookie, "the end is a socket of the guest's network namespace")
	assert.NotEqual(t, hostCookie, rep.EndCookie, "never one of the host's")
	assert.Equal(t, []string{"lo"}, rep.Interfaces, "its ioctls see the guest's interfaces only")
	assert.NotEmpty(t, rep.ConnectUnspec, "it cannot be disconnected")
	assert.NotEmpty(t, rep.ConnectHostName, "nor connected to a host's name")
	assert.Equal(t, "EISCONN", rep.ConnectOwnName, "nor connected anywhere else")
	assert.Equal(t, "EISCONN", rep.SendTo, "nor used to send elsewhere")
	assert.NotEmpty(t, rep.Listen, "nor made to listen")
	assert.Equal(t, "ECONNREFUSED", rep.FreshConnectHostName, "the host's abstract names are not in the guest's namespace")
	if rep.PeerPIDFD == "" { // a kernel with SO_PEERPIDFD
		assert.Equal(t, "EINVAL", rep.PeerSignal, "the host's process is outside the guest's pid namespace: no signal")
		assert.Equal(t, "EPERM", rep.PeerGetfd, "and in another user namespace: none of its descriptors")
	}
	// Whatever the bind did, it did in the guest's namespace: the name is
	// still free in the host's.
	bl, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + bindName, Net: "unix"})
	require.NoError(t, err, "the guest's bind (%q) claimed no name of the host's", rep.Bind)
	bl.Close()
}

// probeBinary returns the test binary where the probe's unprivileged ids
// can run it.
func probeBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "oac-probe-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	src, err := os.Open(os.Args[0])
	require.NoError(t, err)
	defer src.Close()
	dst := filepath.Join(dir, "probe")
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(f, src)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return dst
}
