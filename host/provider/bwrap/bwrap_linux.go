package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
)

// Defaults.
const (
	DefaultStateRoot = "/run/oac"
	// DefaultIDBase is the first host id handed to a sandbox; slot n maps
	// guest ids 0..IDRange-1 to DefaultIDBase+n*IDRange.
	DefaultIDBase = 1_000_000_000
	IDRange       = 65536
	IDSlots       = 4096
)

// Provider runs guests under bubblewrap.
type Provider struct {
	// Bwrap is the bwrap binary; default: found in PATH.
	Bwrap string
	// StateRoot holds per-sandbox state; default DefaultStateRoot.
	StateRoot string
	// IDBase is the first host id of the id slots; default DefaultIDBase.
	IDBase int
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "bwrap" }

func (p *Provider) bwrap() (string, error) {
	if p.Bwrap != "" {
		return p.Bwrap, nil
	}
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return "", fmt.Errorf("%w: bwrap: bubblewrap is not installed (apt-get install bubblewrap)", provider.ErrUnavailable)
	}
	return path, nil
}

func (p *Provider) stateRoot() string {
	if p.StateRoot != "" {
		return p.StateRoot
	}
	return DefaultStateRoot
}

func (p *Provider) idBase() int {
	if p.IDBase != 0 {
		return p.IDBase
	}
	return DefaultIDBase
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	if _, err := p.bwrap(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: bwrap: oac-shim must run as root to map a distinct host id range for the guest (rootless mode is not built yet)", provider.ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return fmt.Errorf("%w: bwrap: user namespaces are disabled (sysctl user.max_user_namespaces=0)", provider.ErrUnavailable)
	}
	return nil
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.Instance, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	bw, err := p.bwrap()
	if err != nil {
		return nil, err
	}
	in := &Instance{spec: spec, bwrap: bw, done: make(chan struct{}), rootFD: -1}
	ok := false
	defer func() {
		if !ok {
			in.release()
		}
	}()
	if err := in.claimDir(filepath.Join(p.stateRoot(), "sandboxes", spec.Name)); err != nil {
		return nil, err
	}
	if err := in.claimIDs(filepath.Join(p.stateRoot(), "ids"), p.idBase()); err != nil {
		return nil, err
	}
	if err := in.prepare(); err != nil {
		return nil, err
	}
	ok = true
	return in, nil
}

// namedFile is an O_PATH descriptor of a binary to install.
type namedFile struct {
	name string
	f    *os.File
}

// Instance is one bwrap sandbox.
type Instance struct {
	spec  provider.Spec
	bwrap string

	dir     string
	dirLock *os.File
	idLock  *os.File
	idBase  int

	ln       *net.UnixListener
	sockPath string
	agentFD  *os.File
	sockFD   *os.File
	rootFD   int
	rootFile *os.File
	etc      [][2]string
	tmpfs    []string
	volumes  []namedFile // name: the guest directory
	installs []namedFile

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
}

// HostPID returns the pid of the bwrap process, 0 before Start.
func (in *Instance) HostPID() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd == nil || in.cmd.Process == nil {
		return 0
	}
	return in.cmd.Process.Pid
}

// HostID implements provider.IDMapper.
func (in *Instance) HostID(id int) (int, int) { return in.idBase + id, in.idBase + id }

// flockDir creates dir (0700) and takes an exclusive lock on dir/lock. A
// leftover directory whose lock is free is stale and reused.
func (in *Instance) claimDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return fmt.Errorf("create state directory %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create state directory %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("open lock in %s: %w", dir, err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return fmt.Errorf("%w: %q is held by another oac-shim (lock %s)", provider.ErrExists, in.spec.Name, lock.Name())
	}
	// Stale content from a sandbox that died without cleaning up.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "lock" {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	in.dir, in.dirLock = dir, lock
	return nil
}

// claimIDs takes the first free id slot.
func (in *Instance) claimIDs(dir string, base int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create id slot directory: %w", err)
	}
	for slot := range IDSlots {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(slot)), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("open id slot %d: %w", slot, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		in.idLock, in.idBase = f, base+slot*IDRange
		return nil
	}
	return fmt.Errorf("all %d id slots are in use: stop some sandboxes", IDSlots)
}

// prepare writes the guest's identity files, creates the transport socket
// and opens the O_PATH descriptors bwrap binds.
func (in *Instance) prepare() error {
	guestRoot := in.idBase
	if err := os.Chown(in.dir, guestRoot, guestRoot); err != nil {
		return fmt.Errorf("chown state directory: %w", err)
	}
	if in.spec.Rootfs == "" {
		etcDir := filepath.Join(in.dir, "etc")
		if err := os.Mkdir(etcDir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", etcDir, err)
		}
		for name, content := range map[string]string{"passwd": passwd(), "group": group(), "hosts": hosts(in.spec.Hostname)} {
			path := filepath.Join(etcDir, name)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
			in.etc = append(in.etc, [2]string{"/etc/" + name, path})
		}
		for _, name := range hostEtcFiles {
			if _, err := os.Stat("/etc/" + name); err == nil {
				in.etc = append(in.etc, [2]string{"/etc/" + name, "/etc/" + name})
			}
		}
		in.tmpfs = RuntimeDirs
	} else {
		f, err := os.OpenFile(in.spec.Rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: rootfs %s: %v", provider.ErrInvalidSpec, in.spec.Rootfs, err)
		}
		in.rootFile = f
		// A read-only rootfs gets writable runtime directories where it
		// has mount points for them (real directories, not symlinks).
		for _, d := range RuntimeDirs {
			var st unix.Stat_t
			if unix.Fstatat(int(f.Fd()), d[1:], &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				in.tmpfs = append(in.tmpfs, d)
			}
		}
	}
	// Volumes replace the tmpfs of their directory.
	var tmpfs []string
	for _, d := range in.tmpfs {
		host, ok := in.spec.Volumes[d]
		if !ok {
			tmpfs = append(tmpfs, d)
			continue
		}
		f, err := os.OpenFile(host, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: volume %s: %v", provider.ErrInvalidSpec, d, err)
		}
		in.volumes = append(in.volumes, namedFile{d, f})
	}
	in.tmpfs = tmpfs
	for d := range in.spec.Volumes {
		found := false
		for _, v := range in.volumes {
			found = found || v.name == d
		}
		if !found {
			return fmt.Errorf("%w: volume %s: the rootfs has no directory %s to mount it on", provider.ErrInvalidSpec, d, d)
		}
	}
	agent, err := openBinary("agent binary", in.spec.AgentPath)
	if err != nil {
		return err
	}
	in.agentFD = agent
	installs := in.spec.Installs()
	names := make([]string, 0, len(installs))
	for n := range installs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f, err := openBinary("install "+n, installs[n])
		if err != nil {
			return err
		}
		in.installs = append(in.installs, namedFile{n, f})
	}
	in.sockPath = filepath.Join(in.dir, "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: in.sockPath, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", in.sockPath, err)
	}
	in.ln = ln
	if err := os.Chown(in.sockPath, guestRoot, guestRoot); err != nil {
		return fmt.Errorf("chown %s: %w", in.sockPath, err)
	}
	if err := os.Chmod(in.sockPath, 0o600); err != nil {
		return fmt.Errorf("chmod %s: %w", in.sockPath, err)
	}
	sock, err := os.OpenFile(in.sockPath, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", in.sockPath, err)
	}
	in.sockFD = sock
	return nil
}

// openBinary opens a host binary for bwrap to bind (O_PATH, so no guest id
// ever traverses the host path). The guest's ids are not the host's, so it
// must be readable and executable by others.
func openBinary(what, path string) (*os.File, error) {
	f, err := os.OpenFile(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v (build it with make build)", provider.ErrInvalidSpec, what, path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o005 != 0o005 {
		f.Close()
		return nil, fmt.Errorf("%w: %s %s must be a regular file readable and executable by others", provider.ErrInvalidSpec, what, path)
	}
	return f, nil
}

// hostEtcFiles are the host /etc entries the default root shares read-only:
// TLS roots, the dynamic linker's cache, name service and time zone data.
var hostEtcFiles = []string{
	"ssl", "ca-certificates", "ca-certificates.conf", "alternatives",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf",
	"localtime", "timezone", "os-release", "protocols", "services", "mime.types",
}

// hostRoot lists the top-level host paths of the default root.
func hostRoot() []hostEntry {
	var out []hostEntry
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err == nil {
				out = append(out, hostEntry{Path: p, Symlink: target})
			}
			continue
		}
		if st.IsDir() {
			out = append(out, hostEntry{Path: p})
		}
	}
	return out
}

// Start implements provider.Instance.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd != nil {
		return errors.New("bwrap: already started")
	}
	// ExtraFiles become fds 3, 4, ... in bwrap.
	extra := []*os.File{in.agentFD, in.sockFD}
	cfg := argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, EtcFiles: in.etc, Tmpfs: in.tmpfs}
	if in.rootFile != nil {
		extra = append(extra, in.rootFile)
		cfg.RootFD = 5
	} else {
		cfg.HostEntries = hostRoot()
	}
	for _, nf := range in.installs {
		cfg.Installs = append(cfg.Installs, installFD{Name: nf.name, FD: 3 + len(extra)})
		extra = append(extra, nf.f)
	}
	for _, nf := range in.volumes {
		cfg.Volumes = append(cfg.Volumes, volumeFD{Dir: nf.name, FD: 3 + len(extra)})
		extra = append(extra, nf.f)
	}
	cmd := exec.Command(in.bwrap, buildArgs(cfg)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	stderr := in.spec.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: in.idBase, Size: IDRange}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: in.idBase, Size: IDRange}},
		GidMappingsEnableSetgroups: true,
		// Root of the new namespace keeps its capabilities across exec.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:  syscall.SIGKILL,
		Setpgid:    true,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start bwrap: %w", err)
	}
	in.cmd = cmd
	go func() {
		err := cmd.Wait()
		in.mu.Lock()
		if err == nil {
			err = errors.New("sandbox runtime exited with status 0")
		} else {
			err = fmt.Errorf("sandbox runtime exited: %w", err)
		}
		in.exitErr = err
		in.mu.Unlock()
		close(in.done)
	}()
	return nil
}

// Accept implements provider.Instance: the next connection of the guest.
func (in *Instance) Accept(ctx context.Context) (net.Conn, error) {
	if in.ln == nil {
		return nil, provider.ErrNotStarted
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() { c, err := in.ln.Accept(); ch <- result{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("accept guest connection: %w", r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		_ = in.ln.SetDeadline(time.Now())
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		_ = in.ln.SetDeadline(time.Time{})
		return nil, fmt.Errorf("accept guest connection: %w", ctx.Err())
	case <-in.done:
		_ = in.ln.SetDeadline(time.Now())
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		_ = in.ln.SetDeadline(time.Time{})
		return nil, in.Err()
	}
}

// Done implements provider.Instance.
func (in *Instance) Done() <-chan struct{} { return in.done }

// Err implements provider.Instance.
func (in *Instance) Err() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.exitErr
}

// Kill implements provider.Instance. Killing bwrap kills the guest's PID 1
// (--die-with-parent), which ends the guest's pid namespace.
func (in *Instance) Kill() error {
	in.mu.Lock()
	cmd := in.cmd
	in.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	select {
	case <-in.done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("bwrap did not exit within 10s of SIGKILL")
	}
}

// Destroy implements provider.Instance.
func (in *Instance) Destroy() error {
	err := in.Kill()
	in.release()
	return err
}

func (in *Instance) release() {
	for _, f := range []*os.File{in.agentFD, in.sockFD, in.rootFile} {
		if f != nil {
			f.Close()
		}
	}
	in.agentFD, in.sockFD, in.rootFile = nil, nil, nil
	for _, nf := range append(in.installs, in.volumes...) {
		nf.f.Close()
	}
	in.installs, in.volumes = nil, nil
	if in.ln != nil {
		in.ln.Close()
		in.ln = nil
	}
	if in.dir != "" {
		ents, _ := os.ReadDir(in.dir)
		for _, e := range ents {
			if e.Name() != "lock" {
				os.RemoveAll(filepath.Join(in.dir, e.Name()))
			}
		}
		os.Remove(filepath.Join(in.dir, "lock"))
		os.Remove(in.dir)
		in.dir = ""
	}
	if in.dirLock != nil {
		in.dirLock.Close()
		in.dirLock = nil
	}
	if in.idLock != nil {
		in.idLock.Close()
		in.idLock = nil
	}
}
