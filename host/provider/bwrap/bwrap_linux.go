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
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/statedir"
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
	state, err := statedir.Claim(p.stateRoot(), spec.Name)
	if err != nil {
		return nil, err
	}
	in.state, in.dir = state, state.Path
	if err := in.claimIDs(filepath.Join(p.stateRoot(), "ids"), p.idBase()); err != nil {
		return nil, err
	}
	if err := in.prepare(); err != nil {
		return nil, err
	}
	ok = true
	return in, nil
}

// Instance is one bwrap sandbox.
type Instance struct {
	spec  provider.Spec
	bwrap string

	state  *statedir.Dir
	dir    string
	idLock *os.File
	idBase int

	ln       *net.UnixListener
	sockPath string
	agentFD  *os.File
	sockFD   *os.File
	rootFD   int
	rootFile *os.File
	etc      [][2]string

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

// claimIDs takes the first free id slot.
func (in *Instance) claimIDs(dir string, base int) error {
	slot, f, err := statedir.ClaimSlot(dir, IDSlots, "id")
	if err != nil {
		return err
	}
	in.idLock, in.idBase = f, base+slot*IDRange
	return nil
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
	} else {
		f, err := os.OpenFile(in.spec.Rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: rootfs %s: %v", provider.ErrInvalidSpec, in.spec.Rootfs, err)
		}
		in.rootFile = f
	}
	agent, err := os.OpenFile(in.spec.AgentPath, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: agent binary %s: %v (build it with make build)", provider.ErrInvalidSpec, in.spec.AgentPath, err)
	}
	in.agentFD = agent
	if st, err := os.Stat(in.spec.AgentPath); err != nil || !st.Mode().IsRegular() || st.Mode()&0o005 != 0o005 {
		return fmt.Errorf("%w: agent binary %s must be a regular file readable and executable by others", provider.ErrInvalidSpec, in.spec.AgentPath)
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
	cfg := argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, EtcFiles: in.etc}
	if in.rootFile != nil {
		extra = append(extra, in.rootFile)
		cfg.RootFD = 5
	} else {
		cfg.HostEntries = hostRoot()
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
	return provider.Accept(ctx, in.ln, in.done, in.Err)
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
	if in.ln != nil {
		in.ln.Close()
		in.ln = nil
	}
	in.state.Release()
	if in.idLock != nil {
		in.idLock.Close()
		in.idLock = nil
	}
}
