package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/bwrap"
	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// DefaultStateRoot holds per-sandbox state (shared with the other
// providers, so sandbox names and id ranges are unique across them).
const DefaultStateRoot = "/run/oac"

// Provider runs guests as OCI containers under runc or crun.
type Provider struct {
	// Runtime is runc, crun or a path to one of them; "" picks runc, then
	// crun, from PATH.
	Runtime string
	// StateRoot holds per-sandbox state; default DefaultStateRoot.
	StateRoot string
	// IDBase is the first host id of the id slots; default the bwrap
	// provider's, so both draw from one allocator.
	IDBase int
	// NoNewPrivileges sets no_new_privs on the agent (the container
	// process); the agent sets it on the daemon either way.
	NoNewPrivileges bool
	// Debug runs the agent with --debug.
	Debug bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "oci" }

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
	return bwrap.DefaultIDBase
}

func (p *Provider) facts() Facts {
	f := Facts{Root: os.Geteuid() == 0, Runtime: p.Runtime}
	switch {
	case p.Runtime == "":
		for _, n := range []string{RuntimeRunc, RuntimeCrun} {
			if path, err := exec.LookPath(n); err == nil {
				f.RuntimePath = path
				break
			}
		}
	default:
		f.RuntimePath, _ = exec.LookPath(p.Runtime)
	}
	f.Layout, f.Unified = cgroupLayout()
	f.Sh, _ = exec.LookPath("sh")
	f.Umount, _ = exec.LookPath("umount")
	return f
}

// cgroupLayout tells v1, hybrid and v2 apart by the filesystem types at
// /sys/fs/cgroup and below it.
func cgroupLayout() (CgroupLayout, string) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return CgroupUnknown, ""
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return CgroupV2, ""
	case unix.TMPFS_MAGIC:
		for _, d := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"} {
			var sub unix.Statfs_t
			if unix.Statfs(d, &sub) == nil && sub.Type == unix.CGROUP2_SUPER_MAGIC {
				return CgroupHybrid, d
			}
		}
		return CgroupV1, ""
	}
	return CgroupUnknown, ""
}

func (p *Provider) runtime() (runtimeCmd, error) {
	rt, ps := Diagnose(p.facts())
	if len(ps) > 0 {
		return rt, problemsError(ps)
	}
	return rt, nil
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	_, err := p.runtime()
	return err
}

// Detail describes how sandboxes would run here (after a nil Check).
func (p *Provider) Detail(ctx context.Context) string {
	rt, err := p.runtime()
	if err != nil {
		return ""
	}
	return rt.Detail()
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.Instance, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	rt, err := p.runtime()
	if err != nil {
		return nil, err
	}
	in := &Instance{spec: spec, rt: rt, id: ContainerID(spec.Name), proc: newProcess(rt.Kind)}
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
	in.state = state
	slot, lock, err := statedir.ClaimSlot(filepath.Join(p.stateRoot(), "ids"), bwrap.IDSlots, "id")
	if err != nil {
		return nil, err
	}
	in.idLock, in.idBase = lock, p.idBase()+slot*bwrap.IDRange
	// A container of this name left by a shim that was killed: we hold the
	// name's lock, so it is stale.
	_ = in.runtimeCmd(deleteArgs(in.id)...).Run()
	cfg, err := in.prepare(p)
	if err != nil {
		return nil, err
	}
	in.bundle = filepath.Join(state.Path, "bundle")
	if err := writeBundle(in.bundle, cfg); err != nil {
		return nil, err
	}
	ok = true
	return in, nil
}

// writeBundle writes config.json into a new bundle directory.
func writeBundle(dir string, c bundleConfig) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create bundle: %w", err)
	}
	b, err := json.MarshalIndent(buildSpec(c), "", "  ")
	if err != nil {
		return fmt.Errorf("encode config.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write config.json: %w", err)
	}
	return nil
}

// Instance is one OCI container.
type Instance struct {
	spec   provider.Spec
	rt     runtimeCmd
	id     string
	bundle string

	state  *statedir.Dir
	idLock *os.File
	idBase int
	ln     *net.UnixListener

	mu   sync.Mutex // serializes Start
	proc *provider.Process
}

// newProcess returns the runtime process (runc run / crun run) of an
// Instance, not started.
func newProcess(kind string) *provider.Process {
	return provider.NewProcess(func(err error) error {
		if err == nil {
			return fmt.Errorf("container exited (%s run returned status 0)", kind)
		}
		return fmt.Errorf("sandbox runtime exited: %s: %w", kind, err)
	}, fmt.Errorf("%s did not exit within 10s of SIGKILL", kind))
}

// ContainerID returns the runtime's id of the container.
func (in *Instance) ContainerID() string { return in.id }

// HostPID returns the pid of the runtime process (runc run / crun run), 0
// before Start.
func (in *Instance) HostPID() int { return in.proc.HostPID() }

// HostID implements provider.IDMapper.
func (in *Instance) HostID(id int) (int, int) {
	if id < 0 || id >= bwrap.IDRange {
		return -1, -1
	}
	return in.idBase + id, in.idBase + id
}

// runtimeCmd returns an exec.Cmd running the runtime with args.
func (in *Instance) runtimeCmd(args ...string) *exec.Cmd {
	argv := in.rt.argv(args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if in.rt.HideCgroup2 != "" {
		// Go makes / private in the new mount namespace, so the umount
		// under sh does not reach the host.
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	return cmd
}

// prepare lays out the state directory: the run directory with the
// transport socket, the guest's identity files and, for the default root,
// a skeleton that the host's directories are bound into.
func (in *Instance) prepare(p *Provider) (bundleConfig, error) {
	dir := in.state.Path
	root := in.idBase
	c := bundleConfig{
		AgentPath: in.spec.AgentPath, Hostname: in.spec.Hostname, IDBase: in.idBase, IDSize: bwrap.IDRange,
		CgroupsPath: cgroupsPath(in.spec.Name), NoNewPrivileges: p.NoNewPrivileges, Debug: p.Debug,
	}
	if st, err := os.Stat(in.spec.AgentPath); err != nil || !st.Mode().IsRegular() || st.Mode()&0o005 != 0o005 {
		return c, fmt.Errorf("%w: agent binary %s must be a regular file readable and executable by others (build it with make build)", provider.ErrInvalidSpec, in.spec.AgentPath)
	}
	// The runtime mounts from inside the guest's user namespace, as guest
	// root: it must reach the sources.
	if err := os.Chown(dir, root, root); err != nil {
		return c, fmt.Errorf("chown state directory: %w", err)
	}
	if in.spec.Rootfs != "" {
		abs, err := filepath.Abs(in.spec.Rootfs)
		if err != nil {
			return c, fmt.Errorf("%w: rootfs %s: %v", provider.ErrInvalidSpec, in.spec.Rootfs, err)
		}
		for _, d := range []string{"proc", "dev", "sys", "tmp", "run"} {
			if st, err := os.Stat(filepath.Join(abs, d)); err != nil || !st.IsDir() {
				return c, fmt.Errorf("%w: rootfs %s has no /%s directory (a read-only root needs its mount points)", provider.ErrInvalidSpec, abs, d)
			}
		}
		c.RootPath = abs
	} else {
		var err error
		if c.RootPath, c.HostEntries, c.EtcFiles, err = in.skeleton(dir); err != nil {
			return c, err
		}
	}
	c.RunDir = filepath.Join(dir, "run")
	if err := os.Mkdir(c.RunDir, 0o700); err != nil {
		return c, fmt.Errorf("create %s: %w", c.RunDir, err)
	}
	// The agent binary's mount point.
	if err := os.WriteFile(filepath.Join(c.RunDir, "oac-guest"), nil, 0o644); err != nil {
		return c, fmt.Errorf("create agent mount point: %w", err)
	}
	sock := filepath.Join(c.RunDir, "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return c, fmt.Errorf("listen on %s: %w", sock, err)
	}
	in.ln = ln
	for _, f := range []string{c.RunDir, sock} {
		if err := os.Chown(f, root, root); err != nil {
			return c, fmt.Errorf("chown %s: %w", f, err)
		}
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		return c, fmt.Errorf("chmod %s: %w", sock, err)
	}
	return c, nil
}

// skeleton makes the default root: an empty directory tree with the mount
// points of the host's /usr, /bin, /lib* (or symlinks to them), /etc with
// the guest's own passwd, group and hosts and the host's TLS, linker and
// name service files.
func (in *Instance) skeleton(dir string) (string, []hostEntry, [][2]string, error) {
	rootfs := filepath.Join(dir, "rootfs")
	entries := hostRoot()
	var etc [][2]string
	mk := func(p string, mode os.FileMode) error {
		if err := os.MkdirAll(p, mode); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		return nil
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "run", "etc", "home", "root"} {
		if err := mk(filepath.Join(rootfs, d), 0o755); err != nil {
			return "", nil, nil, err
		}
	}
	for _, e := range entries {
		p := filepath.Join(rootfs, e.Path)
		if e.Symlink != "" {
			if err := os.Symlink(e.Symlink, p); err != nil {
				return "", nil, nil, fmt.Errorf("create %s: %w", p, err)
			}
		} else if err := mk(p, 0o755); err != nil {
			return "", nil, nil, err
		}
	}
	etcDir := filepath.Join(dir, "etc")
	if err := mk(etcDir, 0o755); err != nil {
		return "", nil, nil, err
	}
	for name, content := range map[string]string{"passwd": passwd(), "group": group(), "hosts": hosts(in.spec.Hostname), "resolv.conf": resolvConf} {
		path := filepath.Join(etcDir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return "", nil, nil, fmt.Errorf("write %s: %w", path, err)
		}
		etc = append(etc, [2]string{"/etc/" + name, path})
	}
	for _, name := range hostEtcFiles {
		if _, err := os.Stat("/etc/" + name); err == nil {
			etc = append(etc, [2]string{"/etc/" + name, "/etc/" + name})
		}
	}
	// Mount points for the /etc binds.
	for _, f := range etc {
		st, err := os.Stat(f[1])
		if err != nil {
			return "", nil, nil, fmt.Errorf("stat %s: %w", f[1], err)
		}
		p := filepath.Join(rootfs, f[0])
		if st.IsDir() {
			err = mk(p, 0o755)
		} else {
			err = os.WriteFile(p, nil, 0o644)
		}
		if err != nil {
			return "", nil, nil, err
		}
	}
	return rootfs, entries, etc, nil
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
			if target, err := os.Readlink(p); err == nil {
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

// Start implements provider.Instance: `runc run` (or crun) in the
// foreground; the runtime process lives as long as the container.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.proc.Started() {
		return errors.New("oci: already started")
	}
	cmd := in.runtimeCmd(runArgs(in.bundle, in.id)...)
	var out io.Writer = io.Discard
	if in.spec.Stderr != nil {
		out = in.spec.Stderr
	}
	// The container inherits the runtime's stdout and stderr: hand the
	// runtime a pipe of our own, so that its exit is seen when it exits
	// (os/exec would otherwise wait for the container to close them).
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("oci: output pipe: %w", err)
	}
	defer pw.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	go func() {
		defer pr.Close()
		_, _ = io.Copy(out, pr)
	}()
	// The runtime dies with the shim; the guest then loses its
	// connection and stops, and Create of the same name deletes the
	// leftover container.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := in.proc.Start(cmd); err != nil {
		pr.Close()
		return fmt.Errorf("start %s: %w", in.rt.Kind, err)
	}
	return nil
}

// Accept implements provider.Instance.
func (in *Instance) Accept(ctx context.Context) (net.Conn, error) {
	if in.ln == nil {
		return nil, provider.ErrNotStarted
	}
	return provider.Accept(ctx, in.ln, in.proc.Done(), in.proc.Err)
}

// Done implements provider.Instance.
func (in *Instance) Done() <-chan struct{} { return in.proc.Done() }

// Err implements provider.Instance.
func (in *Instance) Err() error { return in.proc.Err() }

// Kill implements provider.Instance: SIGKILL to the container's init
// through the runtime (its pid namespace dies with it), then to the
// runtime process if it has not exited.
func (in *Instance) Kill() error {
	return in.proc.KillAsking(func() { _ = in.runtimeCmd(killArgs(in.id)...).Run() }, 3*time.Second)
}

// Destroy implements provider.Instance: kill, delete the container from
// the runtime's state, remove the state directory.
func (in *Instance) Destroy() error {
	err := in.Kill()
	if in.proc.Started() {
		if out, derr := in.runtimeCmd(deleteArgs(in.id)...).CombinedOutput(); derr != nil && in.exists() {
			err = errors.Join(err, fmt.Errorf("%s delete %s: %v: %s", in.rt.Kind, in.id, derr, out))
		}
	}
	in.release()
	return err
}

// exists reports whether the runtime still has state for the container.
func (in *Instance) exists() bool {
	return in.runtimeCmd("state", in.id).Run() == nil
}

func (in *Instance) release() {
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
