package selfreport

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReport(t *testing.T) {
	assert.Equal(t, "none", Report(nil))
	assert.Equal(t, "none", Report([]string{"", ""}))
	got := Report([]string{"mount /mnt/c (9p)", "env WSL_INTEROP", "device /dev/kvm", "env WSL_INTEROP"})
	assert.Equal(t, "device /dev/kvm; env WSL_INTEROP; mount /mnt/c (9p)", got, "sorted, once each")
	assert.Equal(t, []string{"device /dev/kvm", "env WSL_INTEROP", "mount /mnt/c (9p)"}, ParseReport(got))
	assert.Nil(t, ParseReport("none"))
	assert.Equal(t, []string{""}, ParseReport(""), "an empty report is no \"none\"")
}

func TestShow(t *testing.T) {
	assert.Equal(t, "/mnt/c", Show("/mnt/c"))
	assert.Equal(t, "/mnt/My Drive", Show("/mnt/My Drive"), "a space keeps the line and the list intact")
	assert.Equal(t, `"/tmp/a;b"`, Show("/tmp/a;b"), "a ';' would split the list")
	assert.Equal(t, `"/tmp/a\nb"`, Show("/tmp/a\nb"), "a newline would end the log line")
	assert.Equal(t, `"/tmp/\xff"`, Show("/tmp/\xff"))
}

func TestUnderBelow(t *testing.T) {
	assert.True(t, Under("/home/runtime", "/home/runtime"))
	assert.True(t, Under("/home/runtime/ws", "/home/runtime"))
	assert.False(t, Under("/home/runtime2", "/home/runtime"))
	assert.True(t, Under("/x", "/"))
	assert.False(t, Below("/mnt", "/mnt"))
	assert.True(t, Below("/mnt/c", "/mnt"))
	assert.False(t, Below("/mntx/c", "/mnt"))
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                 "/plain",
		`/mnt/My\040Drive`:       "/mnt/My Drive",
		`/a\011b\012c`:           "/a\tb\nc",
		`/back\134slash`:         `/back\slash`,
		`/not\08octal`:           `/not\08octal`,
		`/short\04`:              `/short\04`,
		`/too\777big`:            `/too\777big`,
		`/end\`:                  `/end\`,
		`\040\040`:               "  ",
		`/x\134040`:              `/x\040`,
		`/utf8\303\251t\303\251`: "/utf8été",
	} {
		assert.Equal(t, want, Unescape(in), in)
	}
}

const mountinfo = `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
24 22 0:22 / /mnt/c rw,noatime master:2 shared:7 - 9p drvfs rw,dirsync,aname=drvfs;path=C:\134;uid=1000,trans=fd
25 22 0:23 / /mnt/wsl rw,relatime shared:3 - tmpfs none rw
26 22 0:24 /home /home/runtime rw - virtiofs workspace rw
27 22 0:25 / /home/runtime/sub\040dir rw - 9p ws rw
28 22 0:26 / /srv/share rw - fuse.sshfs user@host:/ rw,user_id=0
29 22 0:27 /docker.sock /var/run/docker.sock rw - tmpfs tmpfs rw,size=1k
30 22 0:28 / /media rw - tmpfs tmpfs rw
31 22 0:29 / /data\040set rw - nfs4 host:/export rw,vers=4.2
`

func TestParseMountinfo(t *testing.T) {
	ms, err := ParseMountinfo(mountinfo)
	require.NoError(t, err)
	require.Len(t, ms, 10)
	assert.Equal(t, Mount{ID: 22, Parent: 1, Dev: "0:21", Root: "/", Point: "/", Options: "rw,relatime",
		Optional: []string{"shared:1"}, FSType: "ext4", Source: "/dev/vda", Super: "rw"}, ms[0])
	assert.Empty(t, ms[1].Optional, "no optional fields")
	assert.Equal(t, []string{"master:2", "shared:7"}, ms[2].Optional)
	assert.Equal(t, "9p", ms[2].FSType)
	assert.Equal(t, "drvfs", ms[2].Source)
	assert.Equal(t, `rw,dirsync,aname=drvfs;path=C:\134;uid=1000,trans=fd`, ms[2].Super, "super options are kept as they are")
	assert.Equal(t, "/home/runtime/sub dir", ms[5].Point)
	assert.Equal(t, "/docker.sock", ms[7].Root)
	assert.Equal(t, "/data set", ms[9].Point)

	ms, err = ParseMountinfo("bad line\n" + "40 1 0:1 / /ok rw - tmpfs t rw\n" + "41 1 0:1 / /x rw shared:1 tmpfs t rw\n")
	assert.Error(t, err, "lines it cannot parse are an error")
	require.Len(t, ms, 1, "the rest are returned")
	assert.Equal(t, "/ok", ms[0].Point)
}

func TestMountFindings(t *testing.T) {
	ms, err := ParseMountinfo(mountinfo)
	require.NoError(t, err)
	sockets := map[string]bool{"/var/run/docker.sock": true}
	got := MountFindings(ms, func(p string) bool { return sockets[p] })
	assert.Equal(t, []string{
		"mount /mnt/c (9p)",
		"mount /mnt/wsl (tmpfs)",
		"mount /srv/share (fuse.sshfs)",
		"mount /var/run/docker.sock (tmpfs, a socket)",
		"mount /data set (nfs4)",
	}, got, "the workspace's shares, /media itself and local filesystems are no door")
}

func TestACoveredMountIsNoDoor(t *testing.T) {
	ms, err := ParseMountinfo(`20 1 0:20 / / rw - ext4 /dev/vda rw
30 20 0:30 / /usr/lib/modules ro - virtiofs modules rw
31 30 0:31 / /usr/lib/modules ro - tmpfs tmpfs ro
40 20 0:40 / /srv/share rw - virtiofs share rw
`)
	require.NoError(t, err)
	assert.Equal(t, []string{"mount /srv/share (virtiofs)"}, MountFindings(ms, nil),
		"a share covered by an empty tmpfs at the same point is out of reach; an uncovered one is a door")
}

func TestHostShareType(t *testing.T) {
	for _, fs := range []string{"9p", "drvfs", "virtiofs", "nfs", "nfs4", "cifs", "smb3", "vboxsf", "fuse", "fuseblk", "fuse.sshfs", "fuse.vmhgfs-fuse"} {
		assert.True(t, HostShareType(fs), fs)
	}
	for _, fs := range []string{"ext4", "tmpfs", "overlay", "proc", "devpts", "fusectl", "squashfs", "erofs"} {
		assert.False(t, HostShareType(fs), fs)
	}
}

func TestEnvFindings(t *testing.T) {
	got := EnvFindings([]string{
		"HOME=/home/runtime",
		"PATH=/usr/local/bin:/usr/bin:/mnt/c/Windows/System32:/mnt/c/Program Files/Git/cmd::/mnt",
		"WSL_INTEROP=/run/WSL/1_interop",
		"DISPLAY=:0",
		"WAYLAND_DISPLAY=wayland-0",
		"SSH_AUTH_SOCK=",
		"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus",
		"DOCKER_HOST=unix:///var/run/docker.sock",
		"PULSE_SERVER=unix:/mnt/wslg/PulseServer",
		"OAC_SERVER_PASSWORD=secret",
		"HTTP_PROXY=http://127.0.0.1:3128",
		"WSLENV=",
	})
	assert.ElementsMatch(t, []string{
		"env PATH has /mnt/c/Windows/System32",
		"env PATH has /mnt/c/Program Files/Git/cmd",
		"env WSL_INTEROP", "env DISPLAY", "env WAYLAND_DISPLAY", "env SSH_AUTH_SOCK",
		"env DBUS_SESSION_BUS_ADDRESS", "env DOCKER_HOST", "env PULSE_SERVER",
	}, got, "never a value: only the name")
	assert.Empty(t, EnvFindings([]string{"PATH=/usr/bin:/bin", "HOME=/home/runtime"}))
}

func TestDeviceAllowed(t *testing.T) {
	for _, p := range []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/console", "/dev/pts/0", "/dev/pts/ptmx"} {
		assert.True(t, DeviceAllowed(p), p)
	}
	for _, p := range []string{"/dev/kvm", "/dev/vsock", "/dev/vhost-vsock", "/dev/net/tun", "/dev/fuse", "/dev/vda", "/dev/tty0", "/dev/sda1", "/dev/dri/card0", "/dev/ptsx", "/dev/mem"} {
		assert.False(t, DeviceAllowed(p), p)
	}
}

func TestHostCommand(t *testing.T) {
	for _, c := range []struct {
		cmdline string
		name    string
		host    bool
	}{
		{"/root/go/bin/oac-shim\x00run\x00--provider\x00bwrap\x00", "oac-shim", true},
		{"oac-shim-crashpoints\x00run\x00", "oac-shim-crashpoints", true},
		{"/tmp/go-build123/b001/e2e.test\x00-test.run\x00TestConformance\x00", "e2e.test", true},
		{"/usr/local/bin/oac-guest\x00agent\x00", "oac-guest", false},
		{"/usr/bin/daemon-standin\x00serve\x00--marker\x00oac-shim\x00", "daemon-standin", false},
		{"", "", false},
		{"\x00", "", false},
	} {
		name, host := HostCommand([]byte(c.cmdline))
		assert.Equal(t, c.name, name, "%q", c.cmdline)
		assert.Equal(t, c.host, host, "%q", c.cmdline)
	}
}

func TestParseNetUnix(t *testing.T) {
	const data = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 23456 /run/x.sock
0000000000000000: 00000002 00000000 00010000 0001 01 23457 @/tmp/.X11-unix/X0
0000000000000000: 00000002 00000000 00000000 0002 01 23458 /run/with space.sock
0000000000000000: 00000003 00000000 00000000 0001 03 23459
garbage
`
	got := ParseNetUnix(data)
	require.Len(t, got, 4)
	assert.Equal(t, UnixSocket{Inode: 23456, Path: "/run/x.sock", Type: 1, Flags: 0x10000}, got[0])
	assert.True(t, got[0].Listening())
	assert.Equal(t, "@/tmp/.X11-unix/X0", got[1].Path)
	assert.Equal(t, "/run/with space.sock", got[2].Path)
	assert.Equal(t, 2, got[2].Type)
	assert.False(t, got[2].Listening())
	assert.Equal(t, "", got[3].Path, "a connected socket has no path")
}

func TestPathDoor(t *testing.T) {
	for _, c := range []struct {
		name string
		s    PathState
		door bool
		why  string
	}{
		{"a socket", PathState{Type: fs.ModeSocket}, true, ""},
		{"a device or fifo", PathState{Type: fs.ModeDevice}, true, ""},
		{"a directory with entries", PathState{Type: fs.ModeDir, Entries: 1, Readable: true, Executable: true}, true, ""},
		{"an empty directory", PathState{Type: fs.ModeDir, Entries: 0, Readable: true, Executable: true}, false, "empty directory"},
		{"a directory it can search, not read", PathState{Type: fs.ModeDir, Entries: -1, Executable: true}, true, ""},
		{"a directory it can neither read nor search", PathState{Type: fs.ModeDir, Entries: -1}, false, "directory, no access"},
		{"a readable file", PathState{Size: 10, Readable: true}, true, ""},
		{"an executable file", PathState{Size: 10, Executable: true}, true, ""},
		{"a mask: mode 000", PathState{Size: 10}, false, "file, no access"},
		{"an empty file", PathState{Readable: true, Executable: true}, false, "empty file"},
		{"a dangling symlink", PathState{Dangling: true}, false, "dangling symlink"},
	} {
		door, why := PathDoor(c.s)
		assert.Equal(t, c.door, door, c.name)
		assert.Equal(t, c.why, why, c.name)
	}
}
