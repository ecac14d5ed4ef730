package workload

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/doors"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// PidsMax is the workload's pids limit (bootstrap.WorkloadPids).
const PidsMax = bootstrap.WorkloadPids

// isolation is how a workload process gets a mount namespace of its own.
type isolation int

const (
	isoNone isolation = iota
	// isoMountNS: the agent holds CAP_SYS_ADMIN in its user namespace (bwrap,
	// a VM, WSL), so a new mount namespace is all it takes.
	isoMountNS
	// isoUserNS: the agent holds CAP_SETUID, CAP_SETGID and CAP_SETFCAP
	// but not CAP_SYS_ADMIN (an OCI runtime's guest): a nested user
	// namespace mapping the same ids to themselves gives the launcher the
	// right to mount in its own mount namespace, and nothing outside it.
	// (Mapping id 0 into it takes CAP_SETFCAP since Linux 5.12.)
	isoUserNS
)

// ErrNotIsolated: a process whose spec masks files cannot get a mount
// namespace of its own here, so it is not started (Command, and the
// launcher itself).
var ErrNotIsolated = errors.New("refused: this guest cannot give the process a mount namespace of its own")

// ErrDoorsOpen: the platform opened doors to the host (package doors)
// and this guest cannot give the process a mount namespace to close them
// in, so it is not started.
var ErrDoorsOpen = errors.New("refused: the platform's doors to the host cannot be closed for the workload without a mount namespace of its own")

// Confinement is how this guest confines the workload, decided once when
// the agent starts and narrowed if the kernel refuses a part.
type Confinement struct {
	log *slog.Logger

	mu      sync.Mutex
	iso     isolation
	why     string // when iso is isoNone: why
	uidMap  []syscall.SysProcIDMap
	gidMap  []syscall.SysProcIDMap
	agentNS uint64
	// cgroup is the workload's cgroup v2 directory when the guest has one
	// to give it; otherwise rlimits apply.
	cgroup   *os.File
	memLimit uint64
	limits   string
	// doors is what every workload process closes (SetDoors).
	doors doors.Plan
	// direct: processes started from now on run under direct mode's
	// filter, whose listener Finish returns (SetDirect).
	direct bool
}

// SetDirect makes every workload process started from now on trap its
// connects to the agent (direct mode): Launch.Finish returns each
// process's listener.
func (c *Confinement) SetDirect(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.direct = on
}

// SetDoors makes every workload process started from now on close the
// platform's doors p in its own mount namespace and leave p's variables
// out of its environment.
func (c *Confinement) SetDoors(p doors.Plan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doors = p
}

// Prepare makes the agent itself not dumpable (so no uid-1000 process can
// read its memory even where it shares that uid) and decides how the
// workload is confined here.
func Prepare(log *slog.Logger) *Confinement {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Warn("cannot make the agent not dumpable", "err", err)
	}
	return detect(log, effectiveCaps())
}

// detect decides the confinement for an agent holding caps (its effective
// capabilities).
func detect(log *slog.Logger, caps uint64) *Confinement {
	c := &Confinement{log: log}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err == nil {
		c.agentNS = st.Ino
	}
	switch {
	case c.agentNS == 0:
		c.why = "no /proc/self/ns/mnt"
	case caps&(1<<unix.CAP_SYS_ADMIN) != 0:
		c.iso = isoMountNS
	case caps&(1<<unix.CAP_SETUID) != 0 && caps&(1<<unix.CAP_SETGID) != 0 && caps&(1<<unix.CAP_SETFCAP) != 0:
		c.uidMap, c.gidMap = identityMap("/proc/self/uid_map"), identityMap("/proc/self/gid_map")
		if len(c.uidMap) == 0 || len(c.gidMap) == 0 {
			c.why = "cannot read the agent's id maps"
		} else {
			c.iso = isoUserNS
		}
	default:
		c.why = "oac-guest holds neither CAP_SYS_ADMIN nor CAP_SETUID, CAP_SETGID and CAP_SETFCAP (to map ids into a nested user namespace)"
	}
	c.memLimit = memoryLimit()
	if cg, err := workloadCgroup(c.memLimit); err == nil {
		c.cgroup = cg
		c.limits = fmt.Sprintf("pids %d and memory %d MiB for the whole workload (cgroup v2 %s)", PidsMax, c.memLimit>>20, cgroupName)
	} else {
		log.Debug("no cgroup for the workload; rlimits instead", "why", err)
		c.setRlimits(err.Error())
	}
	return c
}

func (c *Confinement) setRlimits(why string) {
	c.limits = fmt.Sprintf("%d tasks of uid 1000 and %d MiB of data per process (rlimits: %s)", PidsMax, c.memLimit>>20, why)
}

// Isolated reports whether workload processes get mount namespaces of
// their own (so the daemon cannot see oac-sandbox-io's private file), and
// why not.
func (c *Confinement) Isolated() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.iso != isoNone, c.why
}

// Limits describes the pids and memory limits in force.
func (c *Confinement) Limits() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limits
}

// Launch is one workload process on its way: the command to start (with
// the reaper) and the launcher's two pipes.
type Launch struct {
	Cmd     *exec.Cmd
	spec    []byte
	specW   *os.File
	statusR *os.File
	child   []*os.File // the launcher's ends, closed once it started
	directR *os.File   // the agent's end of the direct socket
	// Listener is, after Finish, the process's direct mode listener
	// (with Confinement.SetDirect and a kernel that made one).
	Listener *os.File
}

// Command prepares the launcher for s: oac-guest itself, in a new session,
// in a mount namespace of its own when this guest allows one, and in the
// workload's cgroup when there is one. The caller sets Stdin, Stdout and
// Stderr, starts Cmd (with no_new_privs), calls Started, then Finish.
func (c *Confinement) Command(s Spec) (*Launch, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(s.Mask) > 0 && c.iso == isoNone {
		// Never run a process where it could read what it must not:
		// the files to mask are another's secrets (oac-sandbox-io's
		// private file, for the daemon, which shares its uid).
		return nil, fmt.Errorf("%w: %s would be able to read %s (%s)", ErrNotIsolated, s.Name, strings.Join(s.Mask, ", "), c.why)
	}
	if !c.doors.Empty() && c.iso == isoNone {
		return nil, fmt.Errorf("%w: %s would reach %s (%s)", ErrDoorsOpen, s.Name, strings.Join(append(c.doors.Detach, c.doors.Cover...), ", "), c.why)
	}
	// Every workload process gets a namespace of its own where the guest
	// allows one: that is where the platform's doors are closed and /dev
	// holds only the contract's devices.
	s.Isolated = c.iso != isoNone
	if s.Isolated {
		s.AgentMountNS = c.agentNS
		s.MinimalDev = doors.Enabled
	}
	s.Doors = c.doors
	s.Env = c.doors.CleanEnv(s.Env)
	if c.cgroup == nil {
		s.Rlimits = []Rlimit{{unix.RLIMIT_NPROC, PidsMax}, {unix.RLIMIT_DATA, c.memLimit}}
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launcher pipe: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, fmt.Errorf("launcher pipe: %w", err)
	}
	cmd := exec.Command("/proc/self/exe", LaunchArg)
	cmd.Args[0] = "oac-guest"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{specR, statusW} // fds 3 and 4
	attr := &syscall.SysProcAttr{Setsid: true}
	switch iso := c.iso; {
	case !s.Isolated:
	case iso == isoMountNS:
		attr.Cloneflags = syscall.CLONE_NEWNS
	case iso == isoUserNS:
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS
		attr.UidMappings, attr.GidMappings = c.uidMap, c.gidMap
		attr.GidMappingsEnableSetgroups = true
		attr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
	}
	if c.cgroup != nil {
		attr.UseCgroupFD, attr.CgroupFD = true, int(c.cgroup.Fd())
	}
	cmd.SysProcAttr = attr
	l := &Launch{Cmd: cmd, specW: specW, statusR: statusR, child: []*os.File{specR, statusW}}
	if c.direct {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("launcher socket: %w", err)
		}
		child := os.NewFile(uintptr(fds[1]), "direct")
		l.directR = os.NewFile(uintptr(fds[0]), "direct")
		cmd.ExtraFiles = append(cmd.ExtraFiles, child) // fd 5
		l.child = append(l.child, child)
		s.Direct = true
	}
	if l.spec, err = json.Marshal(s); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Fallback narrows the confinement after the launcher could not be
// started at all (the kernel or the runtime refused a namespace or the
// cgroup), and reports whether a retry is worth it. Without a namespace a
// process that masks files is then refused by Command (ErrNotIsolated):
// only processes with nothing to hide run without one.
func (c *Confinement) Fallback(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cgroup != nil {
		c.log.Warn("cannot start a process in the workload's cgroup; rlimits instead", "err", err)
		c.cgroup.Close()
		c.cgroup = nil
		c.setRlimits("starting into the cgroup failed: " + err.Error())
		return true
	}
	if c.iso != isoNone {
		c.log.Warn("cannot give workload processes a mount namespace of their own", "err", err)
		c.iso = isoNone
		c.why = "the kernel refused a namespace: " + err.Error()
		return true
	}
	return false
}

// Started closes the launcher's ends of the pipes in the agent.
func (l *Launch) Started() {
	for _, f := range l.child {
		f.Close()
	}
	l.child = nil
}

// Close releases everything when the launcher did not start.
func (l *Launch) Close() {
	l.Started()
	l.specW.Close()
	l.statusR.Close()
	if l.directR != nil {
		l.directR.Close()
	}
}

// launchTimeout bounds the exchange with a started launcher.
const launchTimeout = 10 * time.Second

// Finish hands the launcher its spec and waits until it exec'd the
// workload (nil error, with notes on what could not be applied) or gave
// up (the error says why; the launcher then exits 127).
func (l *Launch) Finish() ([]string, error) {
	defer l.statusR.Close()
	_ = l.specW.SetWriteDeadline(time.Now().Add(launchTimeout))
	_, werr := l.specW.Write(l.spec)
	l.specW.Close()
	_ = l.statusR.SetReadDeadline(time.Now().Add(launchTimeout))
	notes, err := readStatus(l.statusR)
	if err == nil && werr != nil {
		err = fmt.Errorf("hand the launcher its spec: %w", werr)
	}
	if l.directR != nil {
		if err == nil && !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, "direct mode unavailable") }) {
			l.Listener, err = receiveListener(l.directR)
		}
		l.directR.Close()
	}
	return notes, err
}

// effectiveCaps returns the agent's effective capability set.
func effectiveCaps() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n
		}
	}
	return 0
}

// identityMap maps every id the agent's own user namespace maps to
// itself, for a nested namespace that changes no id.
func identityMap(path string) []syscall.SysProcIDMap {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var m []syscall.SysProcIDMap
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil
		}
		inside, err1 := strconv.Atoi(f[0])
		count, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			return nil
		}
		m = append(m, syscall.SysProcIDMap{ContainerID: inside, HostID: inside, Size: count})
	}
	return m
}
