//go:build linux

package selfreport

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	walkDepth   = 6
	walkEntries = 5000
)

// socketRoots are where a socket the workload could reach would be.
var socketRoots = []string{"/run", "/var/run", "/tmp", "/mnt", "/media", "/dev", "/home", "/root", "/srv"}

// ScanDoors looks, as the workload, for every door a platform opens by
// default to the host, and says what it found (Findings sorted, nil: none)
// and what the look cost:
//
//   - mounts: a host share (9p, drvfs, virtiofs, NFS, SMB, vboxsf, FUSE...)
//     other than the workspace, anything below /mnt or /media, a mount
//     whose mount point is a socket ("mount /mnt/c (ext4)");
//   - host paths that must not be there (Docker's socket, the system bus,
//     X11's sockets, WSL's /run/WSL, /mnt/wsl, /mnt/wslg, /mnt/c; /run/user
//     when it holds sockets; /init when WSL's interop is enabled):
//     "host path /run/WSL", unless what is there is no door (PathDoor: an
//     empty directory, an empty or inaccessible file, a dangling symlink,
//     which is what a door the guest closed leaves), which DoorScan.Closed
//     lists;
//   - sockets below /run, /var/run, /tmp, /mnt, /media, /dev, /home, /root
//     and /srv (and abstract ones in /proc/net/unix) whose server is not in
//     the workload's pid namespace: a peer pid of 0 (SO_PEERCRED) says it
//     runs on the host or the platform ("host socket /run/WSL/1_interop");
//     a datagram socket has no peer credentials: one whose server is not in
//     the workload's network namespace counts;
//   - an AF_VSOCK socket the workload may create ("AF_VSOCK socket allowed");
//   - environment variables naming a door ("env WSL_INTEROP", "env PATH
//     has /mnt/c/Windows");
//   - device nodes in /dev beyond the contract's minimal set ("device
//     /dev/kvm");
//   - WSL's interop: "binfmt WSLInterop enabled" when a file starting with
//     "MZ" that the workload writes actually runs;
//   - host processes it can see ("host process visible: pid 12 (oac-shim)").
func ScanDoors() DoorScan {
	start := time.Now()
	var sc DoorScan
	var f []string
	add := func(s ...string) { f = append(f, s...) }
	last := start
	stage := func(name string) {
		now := time.Now()
		sc.Stages = append(sc.Stages, name+" "+now.Sub(last).Round(10*time.Microsecond).String())
		last = now
	}

	add(mountDoors()...)
	stage("mounts")
	doors, closed := wellKnownDoors()
	add(doors...)
	sc.Closed = closed
	stage("paths")

	netns := netUnix()
	seen := map[string]bool{}
	for _, root := range socketRoots {
		entries, complete := walk(root, func(p string, typ fs.FileMode) {
			switch {
			case typ&fs.ModeSocket != 0:
				if !seen[p] {
					seen[p] = true
					add(socketDoor(p, netns))
				}
			case typ&fs.ModeDevice != 0 && Under(p, "/dev") && !DeviceAllowed(p):
				add("device " + Show(p))
			}
		})
		sc.Entries += entries
		if !complete {
			sc.Truncated = append(sc.Truncated, root)
		}
	}
	add(abstractDoors(netns)...)
	stage("sockets and devices")
	if fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
		unix.Close(fd)
		add("AF_VSOCK socket allowed")
	}
	stage("vsock")
	add(EnvFindings(os.Environ())...)
	if interopEnabled() && interopRuns() {
		add("binfmt WSLInterop enabled")
	}
	stage("env and interop")
	add(hostProcesses()...)
	stage("processes")

	sc.Findings = Finish(f)
	if len(sc.Findings) == 0 {
		sc.Findings = nil
	}
	sc.Took = time.Since(start)
	return sc
}

func isSocket(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
}

func mountDoors() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	ms, _ := ParseMountinfo(string(b))
	return MountFindings(ms, isSocket)
}

// wellKnownDoors are the well-known host paths the workload can use (once
// each: /var/run is usually /run), and those that are there but closed,
// with what makes them so (a platform's door a guest closed can leave its
// empty mount point, or a mask).
func wellKnownDoors() (doors, closed []string) {
	type key struct{ dev, ino uint64 }
	seen := map[key]bool{}
	found := func(p string) {
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return
		}
		// The same file by another name (/var/run/docker.sock through
		// the /var/run symlink) is one finding.
		var rst unix.Stat_t
		k := key{st.Dev, st.Ino}
		if unix.Stat(p, &rst) == nil {
			k = key{rst.Dev, rst.Ino}
		}
		if seen[k] {
			return
		}
		seen[k] = true
		if door, why := PathDoor(pathState(p)); door {
			doors = append(doors, "host path "+Show(p))
		} else {
			closed = append(closed, Show(p)+" ("+why+")")
		}
	}
	for _, p := range WellKnownDoors {
		found(p)
	}
	holds := false
	walk("/run/user", func(p string, typ fs.FileMode) { holds = holds || typ&fs.ModeSocket != 0 })
	if holds {
		doors = append(doors, "host path /run/user")
	}
	if interopEnabled() {
		found("/init")
	}
	return doors, closed
}

// pathState is what the workload finds at p, following a symlink.
func pathState(p string) PathState {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return PathState{Dangling: true}
	}
	s := PathState{Size: st.Size, Entries: -1, Executable: unix.Access(p, unix.X_OK) == nil}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		s.Type = fs.ModeDir
		if d, err := os.Open(p); err == nil {
			names, _ := d.Readdirnames(1)
			d.Close()
			s.Entries, s.Readable = len(names), true
		}
	case unix.S_IFREG:
		if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0); err == nil {
			unix.Close(fd)
			s.Readable = true
		}
	case unix.S_IFSOCK:
		s.Type = fs.ModeSocket
	default:
		s.Type = fs.ModeDevice // a device or a fifo: no door check tells it apart
	}
	return s
}

// walk visits the entries below root (not root itself) without following
// a symlink, never into /proc or /sys, down to walkDepth levels and at
// most walkEntries entries. It returns how many it read and whether it
// read them all.
func walk(root string, visit func(p string, typ fs.FileMode)) (int, bool) {
	var st unix.Stat_t
	if unix.Lstat(root, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, true
	}
	n, complete := 0, true
	var dir func(p string, depth int)
	dir = func(p string, depth int) {
		if Under(p, "/proc") || Under(p, "/sys") {
			return
		}
		if depth > walkDepth {
			complete = false
			return
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		d := os.NewFile(uintptr(fd), p)
		defer d.Close()
		for {
			ents, err := d.ReadDir(128)
			for _, e := range ents {
				if n >= walkEntries {
					complete = false
					return
				}
				n++
				child := filepath.Join(p, e.Name())
				typ := e.Type()
				visit(child, typ)
				if typ.IsDir() {
					dir(child, depth+1)
				}
			}
			if err != nil || len(ents) == 0 {
				return
			}
		}
	}
	dir(root, 1)
	return n, complete
}

// netUnix is the unix sockets of the workload's network namespace.
func netUnix() []UnixSocket {
	b, err := os.ReadFile("/proc/self/net/unix")
	if err != nil {
		return nil
	}
	return ParseNetUnix(string(b))
}

// socketDoor connects to the socket at p and says whether its server is
// outside the workload: "" when it is not (or the connection fails).
func socketDoor(p string, netns []UnixSocket) string {
	addr := p
	if len(p) >= 108 {
		// Too long for sockaddr_un: through a descriptor of the path.
		fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return ""
		}
		defer unix.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	switch peerOutside(addr, func() bool { return listedPath(netns, p) }) {
	case outside:
		return "host socket " + Show(p)
	case busy:
		return "host socket " + Show(p) + " (busy: its server could not be told)"
	}
	return ""
}

// listedPath reports whether a socket bound to p is in the workload's
// network namespace.
func listedPath(netns []UnixSocket, p string) bool {
	for _, u := range netns {
		if u.Path == p {
			return true
		}
	}
	return false
}

func abstractDoors(netns []UnixSocket) []string {
	var out []string
	for _, u := range netns {
		if !strings.HasPrefix(u.Path, "@") || !u.Listening() {
			continue
		}
		// An abstract name lives in the network namespace, so this one is
		// the workload's own unless its server is elsewhere.
		if peerOutside("\x00"+u.Path[1:], func() bool { return true }) == outside {
			out = append(out, "host socket "+Show(u.Path))
		}
	}
	return out
}

type peer int

const (
	closed  peer = iota // no connection, or a server of the workload's
	outside             // a server outside the workload's namespaces
	busy                // its backlog stayed full
)

// peerOutside connects to a unix socket and tells where its server is: a
// stream or seqpacket server's pid (SO_PEERCRED, as the workload's pid
// namespace sees it) is 0 when it is outside that namespace; a datagram
// socket carries no credentials, so local says whether its server is in
// the workload's network namespace.
func peerOutside(addr string, local func() bool) peer {
	typ, pid, err := dialPeer(addr)
	switch {
	case errors.Is(err, unix.EAGAIN):
		return busy
	case err != nil:
		return closed
	case typ == unix.SOCK_DGRAM:
		if local() {
			return closed
		}
		return outside
	case pid == 0:
		return outside
	}
	return closed
}

// dialPeer connects to a unix socket without blocking (stream, then
// seqpacket and datagram when the type is wrong) and returns the type
// that connected and the server's pid (SO_PEERCRED; 0 for a datagram
// socket, which has none). A full backlog is retried briefly, then
// EAGAIN.
func dialPeer(addr string) (int, int32, error) {
	var err error
	for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_SEQPACKET, unix.SOCK_DGRAM} {
		var fd int
		fd, err = unix.Socket(unix.AF_UNIX, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, 0, err
		}
		sa := &unix.SockaddrUnix{Name: addr}
		err = unix.Connect(fd, sa)
		for try := 0; errors.Is(err, unix.EAGAIN) && try < 5; try++ {
			// A full backlog (a non-blocking unix connect does not wait).
			time.Sleep(10 * time.Millisecond)
			err = unix.Connect(fd, sa)
		}
		if errors.Is(err, unix.EPROTOTYPE) {
			unix.Close(fd)
			continue
		}
		if err != nil {
			unix.Close(fd)
			return 0, 0, err
		}
		defer unix.Close(fd)
		if typ == unix.SOCK_DGRAM {
			return typ, 0, nil
		}
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			return 0, 0, err
		}
		return typ, cred.Pid, nil
	}
	return 0, 0, err
}

const wslInterop = "/proc/sys/fs/binfmt_misc/WSLInterop"

func interopEnabled() bool {
	b, err := os.ReadFile(wslInterop)
	return err == nil && strings.HasPrefix(string(b), "enabled")
}

// interopRuns writes a tiny file starting with "MZ" where the workload
// may write and runs it: only WSL's interop makes that succeed.
func interopRuns() bool {
	var dir string
	for _, d := range []string{os.TempDir(), os.Getenv("HOME"), WorkspaceShare, "/dev/shm"} {
		if d == "" {
			continue
		}
		if t, err := os.MkdirTemp(d, "doors-"); err == nil {
			dir = t
			break
		}
	}
	if dir == "" {
		return false
	}
	defer os.RemoveAll(dir)
	exe := filepath.Join(dir, "probe.exe")
	if os.WriteFile(exe, []byte("MZ\x90\x00\x03\x00\x00\x00"), 0o755) != nil || os.Chmod(exe, 0o755) != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Dir = dir
	return cmd.Run() == nil
}

// hostProcesses are the host's processes the workload can see in /proc.
func hostProcesses() []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	buf := make([]byte, 4096) // argv[0] is what counts
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.Open("/proc/"+e.Name()+"/cmdline", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		n, err := unix.Read(fd, buf)
		unix.Close(fd)
		if err != nil || n <= 0 {
			continue
		}
		if name, ok := HostCommand(buf[:n]); ok {
			out = append(out, "host process visible: pid "+strconv.Itoa(pid)+" ("+Show(name)+")")
		}
	}
	return out
}
