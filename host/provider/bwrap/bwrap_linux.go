package bwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/protocol"
)

func (p *Provider) driver() provider.Provider { return p }

func (p *Provider) bwrap() (string, error) {
	given := p.Bwrap
	if given == "" && unix.Access(OwnBwrap, unix.X_OK) == nil {
		given = OwnBwrap // a desktop app's own, under its own profile
	}
	return kit.Binary("bwrap", given, "bwrap", "bubblewrap is not installed (apt-get install bubblewrap)")
}

func (p *Provider) idBase() int {
	if p.IDBase != 0 {
		return p.IDBase
	}
	return kit.DefaultIDBase
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	_, err := p.mode()
	return err
}

// Detail describes how sandboxes would run here (after a nil Check).
func (p *Provider) Detail(ctx context.Context) string {
	f := p.facts()
	m, ps := Diagnose(f)
	if len(ps) > 0 {
		return ""
	}
	var detail string
	switch m {
	case ModeRoot:
		detail = fmt.Sprintf("as root: each guest gets a private host id range from %d", p.idBase())
	case ModeSubIDs:
		detail = "rootless: guest root is your uid, guest ids 1.. are your subordinate ids (newuidmap/newgidmap)"
	default:
		detail = "rootless, " + SingleUIDLoss
		if bwrapFeatures(f.BwrapPath).DisableUserns {
			detail += "; user namespaces disabled in the guest (bwrap --disable-userns)"
		}
	}
	if f.ChildLabel != "" {
		// Which profile the guest runs under where AppArmor is enforced.
		detail += fmt.Sprintf("; AppArmor: %s runs the guest as %s", f.BwrapPath, f.ChildLabel)
	}
	return detail
}

// mode gathers the facts of this host and decides the mode.
func (p *Provider) mode() (Mode, error) {
	m, ps := Diagnose(p.facts())
	if len(ps) > 0 {
		return m, fmt.Errorf("%w: bwrap: %w", provider.ErrUnavailable, problemsError(ps))
	}
	return m, nil
}

func (p *Provider) facts() Facts {
	f := Facts{Root: os.Geteuid() == 0, UID: os.Getuid(), GID: os.Getgid(), SingleUIDAllowed: p.SingleUID}
	f.BwrapPath, _ = p.bwrap()
	if r, err := filepath.EvalSymlinks(f.BwrapPath); err == nil && f.BwrapPath != "" {
		// The path the kernel executes, and attaches profiles by (PATH
		// may find /bin/bwrap, a link to /usr/bin/bwrap).
		f.BwrapPath = r
	}
	f.UnprivUsernsClone = readSysctl("/proc/sys/kernel/unprivileged_userns_clone")
	f.MaxUserNamespaces = readSysctl("/proc/sys/user/max_user_namespaces")
	f.AppArmorRestrict = readSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
	if f.BwrapPath != "" && appArmorEnabled() {
		f.BwrapProfile, f.BwrapProfileUserns = attachedProfile(apparmorDir, f.BwrapPath)
		if f.AppArmorRestrict != 1 || f.BwrapProfileUserns {
			r := probeChildCaps(f.BwrapPath)
			f.ChildLabel, f.ChildCapsDenied, f.ProbeErr = r.Label, r.Denied, r.Err
		}
	}
	if f.Root {
		return f
	}
	f.User = strconv.Itoa(f.UID)
	if u, err := user.LookupId(f.User); err == nil {
		f.User = u.Username
	}
	f.SubUIDs = readSubIDs("/etc/subuid", f.User, f.UID)
	f.SubGIDs = readSubIDs("/etc/subgid", f.User, f.UID)
	f.NewUIDMap, _ = exec.LookPath("newuidmap")
	f.NewGIDMap, _ = exec.LookPath("newgidmap")
	return f
}

func readSysctl(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return v
}

func readSubIDs(path, name string, uid int) []IDRangeEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	rs, _ := ParseSubIDs(f, name, uid)
	return rs
}

// apparmorDir holds the host's AppArmor profiles.
const apparmorDir = "/etc/apparmor.d"

// attachedProfile finds the profile file in dir that attaches to bwrap
// (by its resolved path: the kernel attaches by the path it executes) and
// reports whether it grants userns. Ubuntu's bwrap-userns-restrict
// attaches to /usr/bin/bwrap; a bwrap of the app's own has its own.
func attachedProfile(dir, bwrap string) (file string, userns bool) {
	paths := []string{bwrap}
	if r, err := filepath.EvalSymlinks(bwrap); err == nil && r != bwrap {
		paths = append(paths, r)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || len(b) > 1<<20 {
			continue
		}
		for _, p := range paths {
			if attaches(string(b), p) {
				return e.Name(), strings.Contains(string(b), "userns,")
			}
		}
	}
	return "", false
}

// attaches reports whether a profile's header in text attaches to path:
// "profile NAME PATH ... {" or "PATH ... {".
func attaches(text, path string) bool {
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Fields(line)
		if len(fs) > 0 && fs[0] == "profile" {
			fs = fs[1:]
			if len(fs) > 0 && !strings.HasPrefix(fs[0], "/") {
				fs = fs[1:] // the name
			}
		}
		if len(fs) > 1 && fs[0] == path && strings.HasSuffix(strings.TrimSpace(line), "{") {
			return true
		}
	}
	return false
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	mode, err := p.mode()
	if err != nil {
		return nil, err
	}
	bw, _ := p.bwrap()
	in := &Instance{Process: provider.NewProcess(provider.Exits("sandbox runtime exited with status 0", "sandbox runtime exited"), errors.New("bwrap did not exit within 10s of SIGKILL")), spec: spec, bwrap: bw, mode: mode}
	defer in.DestroyOnError(&err)
	root := kit.UserStateRoot(p.StateRoot)
	state, err := kit.ClaimState(in.Process, root, spec.Name)
	if err != nil {
		return nil, err
	}
	in.dir, in.stateRoot = state.Path, root
	if bw != "" {
		if _, err := killLeftovers(state.Path, bw); err != nil {
			return nil, err
		}
	}
	if spec.Keep != nil && len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("%w: a kept sandbox keeps its own /home and /environment: no --volume", provider.ErrInvalidSpec)
	}
	switch mode {
	case ModeRoot:
		claim := func() (*kit.IDs, error) { return kit.ClaimIDs(root, p.idBase()) }
		if spec.Keep != nil {
			// The same host ids every run: what it wrote stays its own.
			claim = func() (*kit.IDs, error) { return kit.ClaimKeptIDs(root, p.idBase(), spec.Keep.Dir) }
		}
		ids, err := claim()
		if err != nil {
			return nil, err
		}
		in.Own(ids)
		in.ids = ids
	case ModeSubIDs:
		f := p.facts()
		in.subUID, _ = pickRange(f.SubUIDs)
		in.subGID, _ = pickRange(f.SubGIDs)
		in.newuidmap, in.newgidmap = f.NewUIDMap, f.NewGIDMap
	}
	if spec.Keep != nil {
		kept, err := kit.PrepareKept(spec.Keep.Dir, spec.Rootfs, spec.InstallNames(), in.HostID)
		if err != nil {
			return nil, err
		}
		in.kept = &kept
		if mode == ModeSubIDs {
			if err := in.ownKeptLocal(p); err != nil {
				return nil, err
			}
		}
		// The kept /home and /environment are bound like volumes.
		in.spec.Volumes = map[string]string{"/home": kept.Home, "/environment": kept.Environment}
	}
	if err := in.prepare(); err != nil {
		return nil, err
	}
	return in, nil
}

// Discard implements provider.Keeper: a bwrap sandbox keeps nothing but
// what is under dir (kit.PrepareKept).
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	if err := kit.DiscardRuntime(kit.UserStateRoot(p.StateRoot), name, nil); err != nil {
		return err
	}
	return p.discard(ctx, dir)
}

// namedFile is a descriptor of a binary to install (or of a volume).
type namedFile struct {
	name string
	f    *os.File
	// copy: f is readable and bwrap copies the binary in.
	copy bool
}

// Instance is one bwrap sandbox; the embedded Process is bwrap's.
type Instance struct {
	*provider.Process
	spec  provider.Spec
	bwrap string
	mode  Mode
	dir   string
	// ModeRoot: the host id range guest ids map to.
	ids *kit.IDs
	// ModeSubIDs: the subordinate ranges guest ids 1.. map to.
	subUID, subGID       IDRangeEntry
	newuidmap, newgidmap string

	agentFD   *os.File
	agentCopy bool
	sockFD    *os.File
	rootFile  *os.File
	// stateRoot is the state root (the prepared /etc lives there), etcDir
	// the default root's /etc and etc the files bound over it.
	stateRoot string
	etcDir    string
	etc       [][2]string
	tmpfs     []string
	volumes   []namedFile // name: the guest directory
	installs  []namedFile
	// kept is a kept sandbox's state (nil: a throwaway one); keptLocal
	// its /usr/local, bin and sbin, opened for bwrap.
	kept      *kit.Kept
	keptLocal []*os.File
}

// HostID returns the host uid and gid guest id maps to; -1 when id is not
// mapped.
func (in *Instance) HostID(id int) (int, int) {
	switch in.mode {
	case ModeRoot:
		return in.ids.HostID(id)
	case ModeSubIDs:
		if id == 0 {
			return os.Getuid(), os.Getgid()
		}
		return in.subUID.Start + id - 1, in.subGID.Start + id - 1
	}
	if id == 1000 {
		return os.Getuid(), os.Getgid()
	}
	return -1, -1
}

// prepare writes the guest's identity files, creates the transport socket
// and opens the O_PATH descriptors bwrap binds.
func (in *Instance) prepare() error {
	guestRoot, guestRootGID := in.HostID(0)
	if in.mode == ModeSingleUID {
		guestRoot, guestRootGID = in.HostID(1000)
	}
	if in.mode == ModeRoot {
		if err := os.Chown(in.dir, guestRoot, guestRootGID); err != nil {
			return fmt.Errorf("chown state directory: %w", err)
		}
	}
	if in.spec.Rootfs == "" {
		// One prepared /etc, shared by the sandboxes of this state root,
		// and the sandbox's own hosts over it when it has a hostname.
		etcDir, err := kit.PreparedEtc(filepath.Join(in.stateRoot, "etc"), map[string]string{"resolv.conf": protocol.ResolvConf})
		if err != nil {
			return err
		}
		in.etcDir = etcDir
		if in.spec.Hostname != "" {
			hosts := filepath.Join(in.dir, "hosts")
			if err := os.WriteFile(hosts, []byte(kit.Hosts(in.spec.Hostname)), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", hosts, err)
			}
			in.etc = [][2]string{{"/etc/hosts", hosts}}
		}
		in.tmpfs = RuntimeDirs
	} else {
		f, err := os.OpenFile(in.spec.Rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: rootfs %s: %v", provider.ErrInvalidSpec, in.spec.Rootfs, err)
		}
		in.rootFile = f
		in.Own(f)
		if in.mode == ModeRoot {
			if err := searchableByOthers(in.spec.Rootfs); err != nil {
				return fmt.Errorf("%w: rootfs %s: %v", provider.ErrInvalidSpec, in.spec.Rootfs, err)
			}
		}
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
		in.Own(f)
		if in.mode == ModeRoot {
			if err := searchableByOthers(host); err != nil {
				return fmt.Errorf("%w: volume %s: %v", provider.ErrInvalidSpec, d, err)
			}
		}
		in.volumes = append(in.volumes, namedFile{name: d, f: f})
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
	if in.kept != nil {
		if in.rootFile != nil {
			var st unix.Stat_t
			if unix.Fstatat(int(in.rootFile.Fd()), "usr/local", &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%w: a kept sandbox needs a /usr/local directory in the rootfs to mount its own on", provider.ErrInvalidSpec)
			}
		}
		for _, d := range []string{in.kept.UsrLocal, in.kept.Bin(), in.kept.Sbin()} {
			f, err := os.OpenFile(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("kept state %s: %w (oac-shim reset the sandbox)", d, err)
			}
			in.Own(f)
			in.keptLocal = append(in.keptLocal, f)
		}
	}
	agent, agentCopy, err := in.openBinary("agent binary", in.spec.AgentPath)
	if err != nil {
		return err
	}
	in.Own(agent)
	in.agentFD, in.agentCopy = agent, agentCopy
	installs := in.spec.Installs()
	for _, n := range in.spec.InstallNames() {
		f, copy, err := in.openBinary("install "+n, installs[n])
		if err != nil {
			return err
		}
		in.Own(f)
		in.installs = append(in.installs, namedFile{n, f, copy})
	}
	sockPath := filepath.Join(in.dir, "agent.sock")
	ln, err := kit.ListenUnix(sockPath)
	if err != nil {
		return err
	}
	in.Own(ln)
	// The guest shares this kernel and dials a unix socket: the data
	// plane can pass it descriptors, or take a dial per connection.
	in.ListenData(ln, protocol.CapDataFD, protocol.CapDataDial)
	if in.mode == ModeRoot {
		if err := os.Chown(sockPath, guestRoot, guestRootGID); err != nil {
			return fmt.Errorf("chown %s: %w", sockPath, err)
		}
	}
	sock, err := os.OpenFile(sockPath, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", sockPath, err)
	}
	in.Own(sock)
	in.sockFD = sock
	return nil
}

// openBinary opens a host binary for bwrap. A binary the guest's root can
// reach and uid 1000 can run is bound (O_PATH, zero copies); any other
// (see bindBinary) is opened for reading and copied in by bwrap, so
// binaries installed anywhere work (a copy of a few MiB per sandbox).
func (in *Instance) openBinary(what, path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s %s: %v (build it with make build)", provider.ErrInvalidSpec, what, path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, false, fmt.Errorf("%w: %s %s is not a regular file", provider.ErrInvalidSpec, what, path)
	}
	reachable := in.mode != ModeRoot || searchableByOthers(filepath.Dir(path)) == nil
	if reachable && st.Mode&0o005 == 0o005 {
		return f, false, nil
	}
	f.Close()
	rf, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s %s: %v", provider.ErrInvalidSpec, what, path, err)
	}
	return rf, true, nil
}

// Start implements provider.Instance.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("bwrap", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	// ExtraFiles become fds 3, 4, ... in bwrap.
	var extra []*os.File
	fd := func(f *os.File) int { extra = append(extra, f); return 2 + len(extra) }
	cfg := argsConfig{RootFD: -1, EtcDir: in.etcDir, EtcFiles: in.etc, Mode: in.mode, Hostname: in.spec.Hostname, Tmpfs: in.tmpfs}
	cfg.DisableUserns = in.mode == ModeSingleUID && bwrapFeatures(in.bwrap).DisableUserns
	cfg.AgentFD, cfg.AgentCopy = fd(in.agentFD), in.agentCopy
	cfg.SocketFD = fd(in.sockFD)
	if in.rootFile != nil {
		cfg.RootFD = fd(in.rootFile)
	} else {
		cfg.HostEntries = kit.HostRoot()
	}
	for _, nf := range in.installs {
		cfg.Installs = append(cfg.Installs, installFD{Name: nf.name, FD: fd(nf.f), Copy: nf.copy})
	}
	for _, nf := range in.volumes {
		cfg.Volumes = append(cfg.Volumes, volumeFD{Dir: nf.name, FD: fd(nf.f)})
	}
	for _, f := range in.keptLocal {
		cfg.KeptLocal = append(cfg.KeptLocal, fd(f))
	}
	var infoR, blockW *os.File
	var childEnds []*os.File
	if in.mode == ModeSubIDs {
		var infoW, blockR *os.File
		var err error
		if infoR, infoW, err = os.Pipe(); err != nil {
			return fmt.Errorf("bwrap: info pipe: %w", err)
		}
		if blockR, blockW, err = os.Pipe(); err != nil {
			infoR.Close()
			infoW.Close()
			return fmt.Errorf("bwrap: userns pipe: %w", err)
		}
		defer infoR.Close()
		defer blockW.Close()
		defer infoW.Close()
		defer blockR.Close()
		cfg.InfoFD, cfg.BlockFD = fd(infoW), fd(blockR)
		childEnds = []*os.File{infoW, blockR}
	}
	cmd := exec.Command(in.bwrap, buildArgs(cfg)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if in.mode == ModeRoot {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: in.ids.Base, Size: kit.IDRange}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: in.ids.Base, Size: kit.IDRange}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = true
		// Root of the new namespace keeps its capabilities across exec.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
	}
	// A pipe of the Process's own: bwrap's exit is seen when it exits,
	// not when the last process of a dying sandbox closes its output.
	if err := in.Process.StartPiped(cmd, in.spec.Stderr); err != nil {
		return fmt.Errorf("start bwrap: %w", err)
	}
	// bwrap has its own copies of the pipe ends it uses.
	for _, f := range childEnds {
		f.Close()
	}
	if in.mode == ModeSubIDs {
		if err := in.mapSubIDs(infoR, blockW); err != nil {
			_ = cmd.Process.Kill()
			return err
		}
	}
	return nil
}

// mapSubIDs waits for bwrap to report the pid of the process in the new
// user namespace, maps guest root to the user and guest ids 1.. to the
// user's subordinate ids with the setuid helpers, then lets bwrap go on.
func (in *Instance) mapSubIDs(infoR, blockW *os.File) error {
	_ = infoR.SetReadDeadline(time.Now().Add(10 * time.Second))
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if err := json.NewDecoder(io.LimitReader(infoR, 4096)).Decode(&info); err != nil || info.ChildPID <= 0 {
		return fmt.Errorf("bwrap: read the sandbox pid from --info-fd: %v", err)
	}
	pid := strconv.Itoa(info.ChildPID)
	for _, m := range []struct {
		helper string
		own    int
		r      IDRangeEntry
	}{{in.newuidmap, os.Getuid(), in.subUID}, {in.newgidmap, os.Getgid(), in.subGID}} {
		out, err := exec.Command(m.helper, pid, "0", strconv.Itoa(m.own), "1", "1", strconv.Itoa(m.r.Start), strconv.Itoa(m.r.Count)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bwrap: %s %s: %v: %s (check /etc/subuid and /etc/subgid)", filepath.Base(m.helper), pid, err, strings.TrimSpace(string(out)))
		}
	}
	if _, err := blockW.Write([]byte{'1'}); err != nil {
		return fmt.Errorf("bwrap: release the user namespace: %w", err)
	}
	return nil
}

// Killing bwrap (the embedded Process's Kill) kills the guest's PID 1
// (--die-with-parent), which ends the guest's pid namespace.

// searchableByOthers checks that dir and every parent can be searched by
// others: bwrap mounts the rootfs as the guest's root, an unprivileged host
// id, and fails with a bare "Permission denied" otherwise.
func searchableByOthers(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %#o) is not searchable by others; the guest's root is not host root, so the directory and every parent need o+x (chmod o+x %s, or move it)", p, st.Mode().Perm(), p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}
