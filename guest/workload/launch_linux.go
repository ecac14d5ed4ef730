package workload

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/doors"
)

// LaunchArg, as oac-guest's first argument, makes it the launcher: it
// reads a Spec from fd 3, confines itself, and execs the workload process
// in its own place (same pid, same process group and session).
const LaunchArg = "--launch-workload"

// The launcher's descriptors: the Spec to read, and the status pipe. The
// status pipe is close-on-exec: EOF after zero or more "note:" lines means
// the workload was exec'd; an "error:" line means it was not, and the
// launcher exits 127.
const (
	specFD   = 3
	statusFD = 4
	// directFD, with Spec.Direct, is a unix socket the launcher passes
	// direct mode's seccomp listener on to the agent, before it execs.
	directFD = 5
	// maxSpec bounds the Spec the launcher reads (argv and environment
	// come from a Bootstrap, itself at most a control frame).
	maxSpec = 1 << 20
)

// Spec is one workload process as the agent asks the launcher to start
// it.
type Spec struct {
	// Name names the process in messages ("daemon", "oac-sandbox-io").
	Name string `json:"name"`
	// Path is the program to exec (absolute); Argv its arguments, argv[0]
	// included; Env its whole environment; Dir its working directory.
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// UID and GID the process runs as, with no supplementary groups.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Mask are files made unreadable in the process's own mount namespace
	// (an empty, mode 000, read-only file mounted over each).
	Mask []string `json:"mask,omitempty"`
	// NoDump runs the program from an unreadable copy, so the kernel marks
	// it not dumpable from its first instruction: no other process of its
	// uid can trace it or read its memory, environment, descriptors, root
	// or working directory through /proc.
	NoDump bool `json:"no_dump,omitempty"`

	// Set by Confinement.Command.

	// Doors are the platform's doors the launcher closes in its own
	// mount namespace (package doors); MinimalDev replaces /dev with the
	// contract's devices.
	Doors      doors.Plan `json:"doors,omitempty"`
	MinimalDev bool       `json:"minimal_dev,omitempty"`

	// Isolated says the launcher runs in a mount namespace of its own;
	// AgentMountNS is the agent's (the launcher checks it is in another
	// before it mounts anything).
	Isolated     bool     `json:"isolated,omitempty"`
	AgentMountNS uint64   `json:"agent_mount_ns,omitempty"`
	Rlimits      []Rlimit `json:"rlimits,omitempty"`
	// Direct installs direct mode's filter last and passes its listener
	// to the agent on directFD.
	Direct bool `json:"direct,omitempty"`
}

// Rlimit is one resource limit the launcher sets.
type Rlimit struct {
	Resource int    `json:"resource"`
	Value    uint64 `json:"value"`
}

// Main is the launcher (oac-guest LaunchArg). It returns only when the
// workload could not be started, with the exit status to use.
func Main() int {
	// Everything from the capability drop to exec happens on this thread:
	// capabilities, the bounding set, no_new_privs and the seccomp filter
	// are per thread, and the exec'ing thread's are the program's.
	runtime.LockOSThread()
	for _, fd := range []int{specFD, statusFD} {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			fmt.Fprintln(os.Stderr, "oac-guest: "+LaunchArg+" is started by oac-guest itself, with its spec on fd 3")
			return 2
		}
	}
	status := os.NewFile(statusFD, "status")
	unix.CloseOnExec(statusFD)
	var s Spec
	err := readSpec(&s)
	if err == nil {
		err = launch(s, status)
	}
	fmt.Fprintf(status, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	return 127
}

func readSpec(s *Spec) error {
	f := os.NewFile(specFD, "spec")
	if f == nil {
		return errors.New("no spec on fd 3")
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSpec+1))
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	if len(b) > maxSpec {
		return errors.New("spec too large")
	}
	if err := json.Unmarshal(b, s); err != nil {
		return fmt.Errorf("decode spec: %w", err)
	}
	if len(s.Argv) == 0 || !strings.HasPrefix(s.Path, "/") {
		return errors.New("spec: an absolute path and an argv are required")
	}
	return nil
}

// launch confines the calling process as s says and execs the program; it
// returns only on failure. Notes (what could not be applied) go to status.
func launch(s Spec, status io.Writer) error {
	note := func(msg string) { fmt.Fprintf(status, "note: %s\n", msg) }

	if len(s.Mask) > 0 && !s.Isolated {
		// The agent never asks for this (Command refuses first); a
		// launcher does not run a process unmasked either way.
		return fmt.Errorf("%w: %s would be able to read %s", ErrNotIsolated, s.Name, strings.Join(s.Mask, ", "))
	}
	if s.Isolated {
		if err := ownMountNS(s.AgentMountNS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		masks, err := closeDoors(s.Doors)
		if err != nil {
			return err
		}
		if s.MinimalDev {
			if err := minimalDev(); err != nil {
				return err
			}
		}
		if err := maskFiles(append(s.Mask, masks...)); err != nil {
			return err
		}
	} else if !s.Doors.Empty() {
		return fmt.Errorf("%w: %s would reach %s", ErrDoorsOpen, s.Name, strings.Join(append(s.Doors.Detach, s.Doors.Cover...), ", "))
	}
	var prog *program
	if s.NoDump {
		p, why := undumpable(s.Path)
		switch {
		case p == nil:
			note(s.Name + " stays dumpable: " + why)
		case why != "":
			note(s.Name + ": " + why)
		}
		prog = p
	}
	for _, r := range s.Rlimits {
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Value, Max: r.Value}); err != nil {
			return fmt.Errorf("set resource limit %d: %w", r.Resource, err)
		}
	}
	if err := dropBoundingSet(); err != nil {
		note("capability bounding set kept: " + err.Error())
	}
	if err := switchIDs(s.UID, s.GID); err != nil {
		return err
	}
	if err := clearCapabilities(); err != nil {
		return err
	}
	if err := unix.Chdir(s.Dir); err != nil {
		return fmt.Errorf("chdir %s: %w", s.Dir, err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := InstallFilter(false); err != nil {
		return err
	}
	if s.Direct {
		// Last: from here on this process's own connects would be
		// trapped. A kernel without Landlock's TCP rules leaves the
		// connects to the capture, which the agent learns from the note;
		// past Landlock, a process with no supervisor could make no TCP
		// connection at all, so it does not run.
		unix.CloseOnExec(directFD)
		l, err := InstallDirect()
		if err == nil {
			err = sendListener(directFD, l)
			l.Close()
		}
		unix.Close(directFD)
		switch {
		case errors.Is(err, ErrNoLandlockTCP):
			note("direct mode unavailable: " + err.Error())
		case err != nil:
			return err
		}
	}
	path := s.Path
	if prog != nil {
		path = prog.path
	}
	err := syscall.Exec(path, s.Argv, s.Env)
	if prog != nil {
		runtime.KeepAlive(prog.mem)
	}
	return fmt.Errorf("exec %s: %w", s.Path, err)
}

// ownMountNS checks the launcher is not in the agent's mount namespace,
// so nothing it mounts is seen by the agent.
func ownMountNS(agent uint64) error {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	if agent == 0 || st.Ino == agent {
		return errors.New("not in a mount namespace of its own: refusing to mount")
	}
	return nil
}

// switchIDs drops to uid:gid with no supplementary groups (every thread:
// Go applies these to the whole process).
func switchIDs(uid, gid int) error {
	if os.Getuid() == uid && os.Geteuid() == uid && os.Getgid() == gid && os.Getegid() == gid {
		// Already the runtime user, as in a single-uid guest, where the
		// kernel may refuse setgroups: the groups stay what the runtime
		// gave the agent.
		_ = syscall.Setgroups([]int{})
		return nil
	}
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("drop supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("set gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("set uid %d: %w", uid, err)
	}
	return nil
}

// dropBoundingSet empties this thread's capability bounding set (it needs
// CAP_SETPCAP, which the agent has in every guest but an OCI or Docker
// one, where the runtime already narrowed the set).
func dropBoundingSet() error {
	last := lastCap()
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 63
	}
	var n int
	if _, err := fmt.Sscanf(string(b), "%d", &n); err != nil {
		return 63
	}
	return n
}

// clearCapabilities empties this thread's ambient, inheritable, permitted
// and effective sets: a single-uid guest's agent runs as uid 1000 with
// ambient capabilities, which exec would otherwise pass on.
func clearCapabilities() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	return nil
}

// readStatus reads the launcher's status pipe until EOF.
func readStatus(r io.Reader) (notes []string, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, 64<<10))
	for sc.Scan() {
		line := sc.Text()
		if msg, ok := strings.CutPrefix(line, "error: "); ok {
			err = errors.New(msg)
		} else if msg, ok := strings.CutPrefix(line, "note: "); ok {
			notes = append(notes, msg)
		}
	}
	if err == nil && sc.Err() != nil {
		err = fmt.Errorf("read the launcher's status: %w", sc.Err())
	}
	return notes, err
}
