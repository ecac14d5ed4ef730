package selfreport

import (
	"errors"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The pure parts of the door probe (Doors, on Linux): what the workload
// reads is parsed and judged here, so that it can be tested anywhere.

// Doors lists the doors the workload found (ScanDoors, per OS).
func Doors() []string { return ScanDoors().Findings }

// DoorScan is what ScanDoors found and what it cost.
type DoorScan struct {
	Findings []string
	Took     time.Duration
	// Entries is how many directory entries the walks read; Truncated
	// names the roots a walk did not finish (depth or entry bound).
	Entries   int
	Truncated []string
	// Stages is what each part took, in order ("mounts 1ms").
	Stages []string
	// Closed are well-known host paths that are there but no door, and
	// why ("/mnt/c (empty directory)").
	Closed []string
}

// DoorsNone is what Report says when nothing was found.
const DoorsNone = "none"

// Report is the findings as the daemon stand-in prints them after
// "doors=": DoorsNone, or the findings sorted, without repeats, joined by
// "; ".
func Report(findings []string) string {
	f := Finish(findings)
	if len(f) == 0 {
		return DoorsNone
	}
	return strings.Join(f, "; ")
}

// ParseReport is Report's inverse: the findings of a "doors=" value (nil
// for DoorsNone only: an empty value is one empty finding).
func ParseReport(v string) []string {
	if v == DoorsNone {
		return nil
	}
	return strings.Split(v, "; ")
}

// Finish sorts findings and drops repeats (and empty ones).
func Finish(findings []string) []string {
	out := make([]string, 0, len(findings))
	seen := map[string]bool{}
	for _, f := range findings {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// Show is a path as a finding names it: as it is, or quoted when it holds
// what would break the log line or the "; " list (a control character, a
// ';', invalid UTF-8).
func Show(p string) string {
	if !utf8.ValidString(p) || strings.ContainsAny(p, ";\"") {
		return strconv.Quote(p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return strconv.Quote(p)
		}
	}
	return p
}

// Under reports whether p is dir or lies below it (both clean and
// absolute).
func Under(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// Below reports whether p lies strictly below dir.
func Below(p, dir string) bool { return p != dir && Under(p, dir) }

// Mount is one line of /proc/self/mountinfo (proc(5)), its paths
// unescaped.
type Mount struct {
	ID, Parent int
	Dev        string // major:minor
	Root       string // the path in its filesystem that is mounted
	Point      string // where, relative to the process's root
	Options    string // per-mount options
	Optional   []string
	FSType     string
	Source     string
	Super      string // per-superblock options
}

// ParseMountinfo parses /proc/self/mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// The optional fields (zero or more) end at "-"; paths carry the kernel's
// octal escapes (\040 a space, \011 a tab, \012 a newline, \134 a
// backslash), which it undoes. A line it cannot parse is an error, the
// rest are still returned.
func ParseMountinfo(data string) ([]Mount, error) {
	var out []Mount
	var errs []error
	for n, line := range strings.Split(data, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		m, err := parseMountLine(line)
		if err != nil {
			errs = append(errs, errors.New("mountinfo line "+strconv.Itoa(n+1)+": "+err.Error()))
			continue
		}
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

func parseMountLine(line string) (Mount, error) {
	f := strings.Split(line, " ")
	if len(f) < 10 {
		return Mount{}, errors.New("too few fields")
	}
	var m Mount
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil {
		return Mount{}, errors.New("bad mount id " + strconv.Quote(f[0]))
	}
	if m.Parent, err = strconv.Atoi(f[1]); err != nil {
		return Mount{}, errors.New("bad parent id " + strconv.Quote(f[1]))
	}
	m.Dev = f[2]
	m.Root, m.Point, m.Options = Unescape(f[3]), Unescape(f[4]), f[5]
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+4 {
		return Mount{}, errors.New("no \"-\" followed by type, source and options")
	}
	m.Optional = f[6:sep]
	m.FSType, m.Source = Unescape(f[sep+1]), Unescape(f[sep+2])
	m.Super = strings.Join(f[sep+3:], " ")
	return m, nil
}

// Unescape undoes the kernel's octal escapes (a backslash and three octal
// digits) in a mountinfo field; anything else is kept as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] >= '0' && s[i+1] <= '3' && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// hostShareTypes are filesystem types that serve a directory of another
// machine or of the host: a share of the VM's or the container's host
// (9p, virtiofs, WSL's drvfs, VirtualBox, VMware, Parallels), a network
// share, or a FUSE filesystem (served by a process, not by this kernel).
var hostShareTypes = map[string]bool{
	"9p": true, "drvfs": true, "virtiofs": true, "nfs": true, "nfs4": true,
	"cifs": true, "smb3": true, "smbfs": true, "vboxsf": true, "vmhgfs": true,
	"prl_fs": true, "fuse": true, "fuseblk": true,
}

// HostShareType reports whether a filesystem type is a host share.
func HostShareType(fstype string) bool {
	return hostShareTypes[fstype] || strings.HasPrefix(fstype, "fuse.")
}

// WorkspaceShare is the contract's workspace: a host share there is the
// contract's own.
const WorkspaceShare = "/home/runtime"

// MountFindings are the doors among mounts: a host share other than the
// workspace, anything mounted below /mnt or /media (WSL's drives and
// WSLg), and any mount whose mount point is a socket (a bind-mounted host
// socket; isSocket reports that of a path).
func MountFindings(ms []Mount, isSocket func(path string) bool) []string {
	// A mount another is stacked on at the same point is out of reach
	// (a guest covers a door it cannot detach, as in a user namespace
	// that locks it): what is there is the top one.
	covered := map[int]bool{}
	for _, m := range ms {
		for _, under := range ms {
			if under.ID == m.Parent && path.Clean(under.Point) == path.Clean(m.Point) {
				covered[under.ID] = true
			}
		}
	}
	var out []string
	for _, m := range ms {
		if covered[m.ID] {
			continue
		}
		p := path.Clean(m.Point)
		share := HostShareType(m.FSType) && !Under(p, WorkspaceShare)
		drive := Below(p, "/mnt") || Below(p, "/media")
		switch {
		case isSocket != nil && isSocket(p):
			out = append(out, "mount "+Show(p)+" ("+Show(m.FSType)+", a socket)")
		case share || drive:
			out = append(out, "mount "+Show(p)+" ("+Show(m.FSType)+")")
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// DoorEnv are the environment variables that name a door to the host:
// WSL's interop socket, an SSH agent, an X11 or Wayland display, a D-Bus
// session bus, a Docker engine, WSLg's PulseAudio server.
var DoorEnv = []string{
	"DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "DOCKER_HOST", "PULSE_SERVER",
	"SSH_AUTH_SOCK", "WAYLAND_DISPLAY", "WSL_INTEROP",
}

// EnvFindings are the doors the environment (KEY=VALUE entries) names:
// any DoorEnv variable that is set, and PATH entries below /mnt (WSL
// appends Windows' PATH as /mnt/c/...).
func EnvFindings(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if contains(DoorEnv, k) {
			out = append(out, "env "+k)
		}
		if k == "PATH" {
			for _, dir := range strings.Split(v, ":") {
				if dir != "" && Below(path.Clean(dir), "/mnt") {
					out = append(out, "env PATH has "+Show(dir))
				}
			}
		}
	}
	return out
}

// allowedDevices are the device nodes the contract's minimal /dev holds.
var allowedDevices = map[string]bool{
	"/dev/null": true, "/dev/zero": true, "/dev/full": true, "/dev/random": true,
	"/dev/urandom": true, "/dev/tty": true, "/dev/ptmx": true, "/dev/console": true,
}

// DeviceAllowed reports whether a device node at p (a clean path) is one
// the workload may have: the contract's minimal /dev, and its
// pseudo-terminals.
func DeviceAllowed(p string) bool {
	return allowedDevices[p] || Under(p, "/dev/pts")
}

// HostCommand reports whether a process's /proc/PID/cmdline is a host
// process the workload must never see (oac-shim, or the e2e test binary),
// and its argv[0]'s base name.
func HostCommand(cmdline []byte) (string, bool) {
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	if argv0 == "" {
		return "", false
	}
	base := path.Base(argv0)
	return base, strings.HasPrefix(base, "oac-shim") || base == "e2e.test"
}

// WellKnownDoors are host paths that must not exist in a sandbox: Docker's
// and containerd's sockets, the system D-Bus, X11's sockets, WSL's
// interop, WSLg and drive mounts. (/run/user counts only when it holds a
// socket, /init only when WSL's interop is enabled: Doors checks those.)
var WellKnownDoors = []string{
	"/mnt/c", "/mnt/wsl", "/mnt/wslg",
	"/run/WSL", "/run/containerd/containerd.sock", "/run/dbus/system_bus_socket", "/run/docker.sock",
	"/tmp/.X11-unix", "/var/run/docker.sock",
}

// PathState is what the workload finds at a well-known host path (after
// a symlink).
type PathState struct {
	Dangling bool        // a symlink to nothing
	Type     fs.FileMode // fs.ModeDir, fs.ModeSocket, 0 for a regular file, fs.ModeDevice for anything else
	Size     int64
	// Entries is a directory's count of entries up to 1 (-1: it could not
	// be read).
	Entries int
	// Readable: it opened for reading; Executable: access(X_OK), which
	// for a directory is search.
	Readable, Executable bool
}

// PathDoor says whether what is at a well-known host path is a door, and
// when it is not, why not. A socket, a device or a fifo is; a directory
// is when it holds anything, or, unreadable, when it can be searched
// (names in it still resolve); a file is when it holds anything and can
// be read or executed. An empty directory (the mount point of a share
// that is gone, an empty tmpfs over a socket directory), an empty or
// inaccessible file (a mask) and a dangling symlink are none.
func PathDoor(s PathState) (bool, string) {
	switch {
	case s.Dangling:
		return false, "dangling symlink"
	case s.Type == fs.ModeDir && s.Entries > 0:
		return true, ""
	case s.Type == fs.ModeDir && s.Entries == 0:
		return false, "empty directory"
	case s.Type == fs.ModeDir && s.Executable:
		return true, ""
	case s.Type == fs.ModeDir:
		return false, "directory, no access"
	case s.Type == 0 && s.Size == 0:
		return false, "empty file"
	case s.Type == 0 && (s.Readable || s.Executable):
		return true, ""
	case s.Type == 0:
		return false, "file, no access"
	}
	return true, ""
}

// UnixSocket is a listening socket of /proc/net/unix.
type UnixSocket struct {
	Inode uint64
	Path  string // "@name" for an abstract socket
	Type  int    // SOCK_STREAM 1, SOCK_DGRAM 2, SOCK_SEQPACKET 5
	Flags uint64
}

// soAcceptCon is __SO_ACCEPTCON in /proc/net/unix's Flags: listening.
const soAcceptCon = 1 << 16

// Listening reports whether the socket listens.
func (u UnixSocket) Listening() bool { return u.Flags&soAcceptCon != 0 }

// ParseNetUnix parses /proc/net/unix:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 23456 /run/x.sock
//
// Abstract names come with a leading '@'. Lines it cannot parse are
// skipped.
func ParseNetUnix(data string) []UnixSocket {
	var out []UnixSocket
	for i, line := range strings.Split(data, "\n") {
		if i == 0 {
			continue
		}
		f, rest := fieldsN(line, 7)
		if len(f) < 7 {
			continue
		}
		flags, err1 := strconv.ParseUint(f[3], 16, 64)
		typ, err2 := strconv.ParseUint(f[4], 16, 32)
		ino, err3 := strconv.ParseUint(f[6], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		u := UnixSocket{Inode: ino, Type: int(typ), Flags: flags}
		// The path is the rest of the line (it may hold spaces).
		u.Path = rest
		out = append(out, u)
	}
	return out
}

// fieldsN splits off the first n space-separated fields of line and
// returns them and what follows the space after the last.
func fieldsN(line string, n int) ([]string, string) {
	var f []string
	for len(f) < n {
		line = strings.TrimLeft(line, " ")
		if line == "" {
			return f, ""
		}
		tok, after, _ := strings.Cut(line, " ")
		f = append(f, tok)
		line = after
	}
	return f, line
}
