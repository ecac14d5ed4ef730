package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/host/provider/statedir"
	"github.com/oac/sandbox-agent/protocol"
)

func (p *Provider) driver() provider.Provider { return p }

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

// Detail implements provider.Detailer.
func (p *Provider) Detail(ctx context.Context) string {
	if rt, err := p.runtime(); err == nil {
		return rt.Detail()
	}
	return ""
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	rt, err := p.runtime()
	if err != nil {
		return nil, err
	}
	in := &Instance{Process: provider.NewProcess(provider.Exits(fmt.Sprintf("container exited (%s run returned status 0)", rt.Kind), "sandbox runtime exited: "+rt.Kind),
		fmt.Errorf("%s did not exit within 10s of SIGKILL", rt.Kind)),
		spec: spec, rt: rt, id: ContainerID(spec.Name)}
	defer in.DestroyOnError(&err)
	root := kit.StateRoot(p.StateRoot)
	state, err := kit.ClaimState(in.Process, root, spec.Name)
	if err != nil {
		return nil, err
	}
	in.state = state
	if spec.Keep != nil && len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("%w: a kept sandbox keeps its own /home and /environment: no --volume", provider.ErrInvalidSpec)
	}
	var ids *kit.IDs
	if spec.Keep != nil {
		// The same host ids every run: what it wrote stays its own.
		ids, err = kit.ClaimKeptIDs(root, p.IDBase, spec.Keep.Dir)
	} else {
		ids, err = kit.ClaimIDs(root, p.IDBase)
	}
	if err != nil {
		return nil, err
	}
	in.Own(ids)
	in.ids = ids
	if spec.Keep != nil {
		kept, err := kit.PrepareKept(spec.Keep.Dir, spec.Rootfs, spec.InstallNames(), ids.HostID)
		if err != nil {
			return nil, err
		}
		in.kept = &kept
		// The kept /home and /environment are bound like volumes.
		in.spec.Volumes = map[string]string{"/home": kept.Home, "/environment": kept.Environment}
	}
	// A container of this name left by a shim that was killed: we hold the
	// name's lock, so it is stale.
	_ = in.runtimeCmd(deleteArgs(in.id)...).Run()
	// Destroy deletes the container from the runtime's state.
	in.OnDestroy(in.delete)
	cfg, err := in.prepare(p)
	if err != nil {
		return nil, err
	}
	in.bundle = filepath.Join(state.Path, "bundle")
	if err := writeBundle(in.bundle, cfg); err != nil {
		return nil, err
	}
	// SIGKILL to the container's init through the runtime first (its pid
	// namespace dies with it), then to the runtime process if it has not
	// exited.
	in.KillBy(func() error {
		return in.KillAsking(func() { _ = in.runtimeCmd(killArgs(in.id)...).Run() }, 3*time.Second)
	})
	return in, nil
}

// Discard implements provider.Keeper: an OCI sandbox keeps nothing but
// what is under dir (kit.PrepareKept); its container is deleted with
// every run.
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	err := kit.DiscardRuntime(kit.StateRoot(p.StateRoot), name, func() error {
		// The container's runtime state, when the runtime is here (a
		// throwaway sandbox of the name has the same container id).
		if rt, err := p.runtime(); err == nil {
			_ = (&Instance{rt: rt}).runtimeCmd(deleteArgs(ContainerID(name))...).Run()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return kit.DiscardKept(dir)
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

// Instance is one OCI container; the embedded Process is the runtime's
// (runc run / crun run), which lives as long as the container.
type Instance struct {
	*provider.Process
	spec   provider.Spec
	rt     runtimeCmd
	id     string
	bundle string
	state  *statedir.Dir
	ids    *kit.IDs
	// kept is a kept sandbox's state (nil: a throwaway one).
	kept *kit.Kept
}

// ContainerID returns the runtime's id of the container.
func (in *Instance) ContainerID() string { return in.id }

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
	root := in.ids.Base
	c := bundleConfig{
		Hostname: in.spec.Hostname, IDBase: in.ids.Base, IDSize: kit.IDRange,
		CgroupsPath: cgroupsPath(in.spec.Name), NoNewPrivileges: p.NoNewPrivileges, Debug: p.Debug,
	}
	hp, err := kit.CheckHostPaths(in.spec)
	if err != nil {
		return c, err
	}
	c.AgentPath = hp.Agent
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
	if err := in.contract(&c, hp, dir); err != nil {
		return c, err
	}
	run, ln, err := kit.RunDir(dir)
	if ln != nil {
		in.Own(ln)
		in.ListenData(ln, protocol.CapDataFD, protocol.CapDataDial)
	}
	if err != nil {
		return c, err
	}
	c.RunDir = run
	for _, f := range []string{run, ln.Addr().String()} {
		if err := os.Chown(f, root, root); err != nil {
			return c, fmt.Errorf("chown %s: %w", f, err)
		}
	}
	return c, nil
}

// contract lays out what the hosted contract needs besides the root: the
// writable /home and /environment (tmpfs, or volumes), the installed
// binaries and, in a --rootfs that has one, the resolver's
// /etc/resolv.conf. A --rootfs cannot get new mount points (the runtime,
// as guest root, cannot create them in a host directory it does not own):
// what it lacks is refused here, before anything runs.
func (in *Instance) contract(c *bundleConfig, hp kit.HostPaths, dir string) error {
	rootfs := c.RootPath
	has := func(p string, dir bool) bool {
		if in.spec.Rootfs == "" {
			return true
		}
		st, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			return false
		}
		if dir {
			return st.IsDir()
		}
		return st.Mode().IsRegular()
	}
	for _, d := range provider.VolumeDirs {
		host, isVolume := hp.Volumes[d]
		switch {
		case !has(d, true) && isVolume:
			return fmt.Errorf("%w: volume %s: the rootfs has no directory %s to mount it on", provider.ErrInvalidSpec, d, d)
		case !has(d, true):
			continue
		}
		c.Writable = append(c.Writable, writableDir{Dir: d, Host: host})
	}
	for _, inst := range hp.Installs {
		n := inst[0]
		if in.kept == nil && !has(filepath.Join(kit.GuestInstallDir, n), false) {
			return fmt.Errorf("%w: install %s: the rootfs has no regular file %s/%s to bind it over (a read-only root cannot get new mount points; oac-image build puts oac-sandbox-io there, --file others)",
				provider.ErrInvalidSpec, n, kit.GuestInstallDir, n)
		}
		c.Installs = append(c.Installs, inst)
	}
	if in.kept != nil {
		if !has("usr/local", true) {
			return fmt.Errorf("%w: a kept sandbox needs a /usr/local directory in the rootfs to mount its own on", provider.ErrInvalidSpec)
		}
		c.Kept = in.kept
	} else if in.spec.Rootfs == "" && len(hp.Installs) > 0 {
		c.LocalDir = filepath.Join(dir, "usrlocal")
		bin := filepath.Join(c.LocalDir, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", bin, err)
		}
		for _, inst := range hp.Installs {
			if err := os.WriteFile(filepath.Join(bin, inst[0]), nil, 0o644); err != nil {
				return fmt.Errorf("create install mount point: %w", err)
			}
		}
		if err := os.Chmod(c.LocalDir, 0o755); err != nil {
			return err
		}
	}
	if in.spec.Rootfs != "" && has("etc/resolv.conf", false) {
		c.ResolvConf = filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(c.ResolvConf, []byte(protocol.ResolvConf), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", c.ResolvConf, err)
		}
	}
	return nil
}

// skeleton makes the default root: an empty directory tree with the mount
// points of the host's /usr, /bin, /lib* (or symlinks to them), /etc with
// the guest's own passwd, group and hosts and the host's TLS, linker and
// name service files.
func (in *Instance) skeleton(dir string) (string, []kit.HostEntry, [][2]string, error) {
	rootfs := filepath.Join(dir, "rootfs")
	entries := kit.HostRoot()
	mk := func(p string, mode os.FileMode) error {
		if err := os.MkdirAll(p, mode); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		return nil
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "run", "etc", "home", "environment", "root"} {
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
	etc, err := kit.EtcFiles(filepath.Join(dir, "etc"), in.spec.Hostname, map[string]string{"resolv.conf": protocol.ResolvConf})
	if err != nil {
		return "", nil, nil, err
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

// Start implements provider.Instance: `runc run` (or crun) in the
// foreground; the runtime process lives as long as the container.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("oci", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	cmd := in.runtimeCmd(runArgs(in.bundle, in.id)...)
	// The runtime dies with the shim; the guest then loses its
	// connection and stops, and Create of the same name deletes the
	// leftover container.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := in.StartPiped(cmd, in.spec.Stderr); err != nil {
		return fmt.Errorf("start %s: %w", in.rt.Kind, err)
	}
	return nil
}

// delete deletes a started container from the runtime's state.
func (in *Instance) delete() error {
	if !in.Started() {
		return nil
	}
	if out, err := in.runtimeCmd(deleteArgs(in.id)...).CombinedOutput(); err != nil && in.exists() {
		return fmt.Errorf("%s delete %s: %v: %s", in.rt.Kind, in.id, err, out)
	}
	return nil
}

// exists reports whether the runtime still has state for the container.
func (in *Instance) exists() bool {
	return in.runtimeCmd("state", in.id).Run() == nil
}
