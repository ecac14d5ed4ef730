//go:build linux

// Command probe is a TEST FIXTURE: a hostile daemon. Started by oac-guest
// as the daemon (uid 1000) next to oac-sandbox-io's stand-in, it tries to
// reach oac-sandbox-io's private file and memory, to leave the sandbox's
// seccomp filter and limits, and prints each outcome as a "probe:
// key=value" line (an errno name, "ok", or a value), then "probe: done",
// and waits for SIGTERM. It is static and needs no shell, so the same
// binary runs in bwrap, OCI and VM guests.
//
//	probe [--bomb]
//
// --bomb then re-execs itself to fork until the kernel refuses (the pids
// limit), counting.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/internal/syscall32"
)

const private = "/home/runtime/sandbox-io-bootstrap.json"

func say(key string, v any) { fmt.Printf("probe: %s=%v\n", key, v) }

func main() {
	switch {
	case len(os.Args) > 1 && os.Args[1] == "newuser":
		// Run in a child cloned with CLONE_NEWUSER: getting here means the
		// namespace was created.
		fmt.Println("in a new user namespace")
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "forker" {
		// First: no goroutine of its own (not even signal handling's) may
		// want a thread while the limit is reached.
		forker()
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if len(os.Args) < 2 || os.Args[1] != "forker" {
		probe()
		if len(os.Args) > 1 && os.Args[1] == "--bomb" {
			// The bomb runs in this process, exec'd afresh: nothing else of
			// it may need a new thread while the limit is reached (the Go
			// runtime dies when it cannot make one).
			err := syscall.Exec("/proc/self/exe", []string{os.Args[0], "forker"}, os.Environ())
			say("forker", errName(err))
		}
	}
	say("done", "1")
	<-term
}

func probe() {
	groups, _ := os.Getgroups()
	say("ids", fmt.Sprintf("uid=%d gid=%d groups=%v", os.Getuid(), os.Getgid(), groups))
	for _, f := range []string{"NoNewPrivs", "Seccomp", "CapEff", "CapBnd", "CapAmb", "CapPrm"} {
		say(f, status("self", f))
	}
	uidMap, _ := os.ReadFile("/proc/self/uid_map")
	say("uid-map", strings.Join(strings.Fields(string(uidMap)), " "))

	// The private file, directly.
	_, err := os.ReadFile(private)
	say("read-private", errName(err))
	var st unix.Stat_t
	if err := unix.Stat(private, &st); err == nil {
		say("private-stat", fmt.Sprintf("mode=%04o size=%d", st.Mode&0o7777, st.Size))
	} else {
		say("private-stat", errName(err))
	}
	say("unlink-private", errName(os.Remove(private)))
	say("rename-private", errName(os.Rename(private, private+".mine")))

	sio := findSandboxIO()
	say("sandbox-io-found", sio > 0)
	if sio > 0 {
		p := fmt.Sprintf("/proc/%d", sio)
		comm, _ := os.ReadFile(p + "/comm")
		say("sandbox-io-comm", strings.TrimSpace(string(comm)))
		_, err = os.ReadFile(p + "/root" + private)
		say("read-private-via-proc-root", errName(err))
		_, err = os.ReadFile(p + "/cwd/../../home/runtime/sandbox-io-bootstrap.json")
		say("read-private-via-proc-cwd", errName(err))
		f, err := os.Open(p + "/mem")
		say("open-mem", errName(err))
		if err == nil {
			f.Close()
		}
		_, err = os.ReadFile(p + "/environ")
		say("read-environ", errName(err))
		_, err = os.ReadFile(p + "/maps")
		say("read-maps", errName(err))
		_, err = os.ReadDir(p + "/fd")
		say("list-fd", errName(err))
		_, err = os.Readlink(p + "/exe")
		say("readlink-exe", errName(err))
		_, err = os.ReadFile(p + "/cmdline")
		say("read-cmdline", errName(err)) // public, like ps shows it
		say("ptrace-attach", errnoName(rawErr(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(sio))))
		say("ptrace-seize", errnoName(rawErr(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(sio))))
		var b [64]byte
		_, err = unix.ProcessVMReadv(sio, []unix.Iovec{{Base: &b[0], Len: 64}}, []unix.RemoteIovec{{Base: 0x400000, Len: 64}}, 0)
		say("process-vm-readv", errName(err))
		if fd, err := unix.PidfdOpen(sio, 0); err == nil {
			_, err = unix.PidfdGetfd(fd, 0, 0)
			say("pidfd-getfd", errName(err))
			unix.Close(fd)
		} else {
			say("pidfd-getfd", "pidfd_open "+errName(err))
		}
		if syscall32.Available() {
			say("i386-ptrace-attach", errno32(syscall32.Call(26, unix.PTRACE_ATTACH, uintptr(sio), 0)))
		}
		// Signals are not the filter's: same uid, so the daemon may signal
		// it (0 only checks).
		say("signal-0", errName(unix.Kill(sio, 0)))
	}

	if !syscall32.Available() {
		say("i386", "unavailable") // the kernel does not take int 0x80 here
	}

	// Leaving the sandbox: new user namespaces, in every way.
	cmd := exec.Command("/proc/self/exe", "newuser")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}}
	out, err := cmd.CombinedOutput()
	say("clone-newuser", errName(err)+strings.TrimSpace(" "+string(bytes.TrimSpace(out))))
	say("unshare-newuser", errnoName(rawErr(unix.SYS_UNSHARE, unix.CLONE_NEWUSER)))
	say("clone3", errnoName(rawErr(unix.SYS_CLONE3)))
	// The host's network through a socket: its interfaces, binding to one.
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		ifr, _ := unix.NewIfreq("lo")
		say("ioctl-ifflags", errName(unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr)))
		say("bindtodevice", errName(unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo")))
		unix.Close(fd)
	}
	// Whether this kernel could refuse the workload's own TCP connects, as
	// direct mode needs (what the agent's check says).
	if err := workload.LandlockTCP(); err != nil {
		say("landlock-tcp", err.Error())
	} else {
		say("landlock-tcp", "ok")
	}
	if syscall32.Available() {
		say("i386-unshare-newuser", errno32(syscall32.Call(310, unix.CLONE_NEWUSER, 0, 0)))
	}
	if path, err := exec.LookPath("unshare"); err == nil {
		out, err := exec.Command(path, "-Ur", "id", "-u").CombinedOutput()
		say("unshare-Ur", fmt.Sprintf("%s: %s", errName(err), strings.TrimSpace(string(out))))
	} else {
		say("unshare-Ur", "no unshare binary")
	}
	for name, trap := range map[string]uintptr{"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "bpf": unix.SYS_BPF,
		"perf_event_open": unix.SYS_PERF_EVENT_OPEN, "userfaultfd": unix.SYS_USERFAULTFD, "io_uring_setup": unix.SYS_IO_URING_SETUP} {
		say(name, errnoName(rawErr(trap)))
	}

	// Limits.
	var rl unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NPROC, &rl)
	say("rlimit-nproc", rl.Cur)
	_ = unix.Getrlimit(unix.RLIMIT_DATA, &rl)
	say("rlimit-data", rl.Cur)
	cg := ownCgroup()
	say("cgroup", cg)
	if cg != "" {
		for _, f := range []string{"pids.max", "memory.max"} {
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, f))
			if err != nil {
				say("cgroup-"+f, errName(err))
			} else {
				say("cgroup-"+f, strings.TrimSpace(string(b)))
			}
		}
	}
}

// forker forks children that only wait, until the kernel refuses one, and
// reports how many it made, why it stopped, and how many tasks uid 1000 had
// at that moment. Until the children are gone it runs on one thread with
// the collector off, so the runtime needs no new thread.
func forker() {
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(-1)
	runtime.LockOSThread()
	var kids []int
	var stop error
	for len(kids) < 1000 {
		pid, err := forkIdle()
		if err != nil {
			stop = err
			break
		}
		kids = append(kids, pid)
	}
	tasks := uidTasks(os.Getuid())
	for _, k := range kids {
		_ = unix.Kill(k, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(k, &ws, 0, nil)
	}
	runtime.UnlockOSThread()
	debug.SetGCPercent(100)
	say("forked", len(kids))
	say("fork-stopped", errName(stop))
	say("uid-tasks", tasks)
}

// forkIdle forks a child that only sleeps in ppoll until killed. The child
// makes raw system calls only: it is a copy of one thread of a Go program
// and must not run the runtime.
//
//go:nosplit
func forkIdle() (int, error) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	if r == 0 {
		for {
			syscall.RawSyscall6(unix.SYS_PPOLL, 0, 0, 0, 0, 0, 0)
		}
	}
	return int(r), nil
}

// uidTasks counts the threads of every process of uid it can see.
func uidTasks(uid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		u := strings.Fields(status(e.Name(), "Uid"))
		if len(u) > 0 && u[0] == strconv.Itoa(uid) {
			t, _ := strconv.Atoi(status(e.Name(), "Threads"))
			n += t
		}
	}
	return n
}

// findSandboxIO returns the pid of oac-sandbox-io (by its command line,
// which stays public), waiting up to 10 s for it.
func findSandboxIO() int {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		var pids []int
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if bytes.Contains(b, []byte("--bootstrap-file\x00"+private)) {
				pids = append(pids, pid)
			}
		}
		if len(pids) > 0 {
			sort.Ints(pids)
			return pids[0]
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0
}

func ownCgroup() string {
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				return p
			}
		}
	}
	return ""
}

func status(pid, field string) string {
	b, _ := os.ReadFile("/proc/" + pid + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func rawErr(trap uintptr, args ...uintptr) unix.Errno {
	a := make([]uintptr, 6)
	copy(a, args)
	_, _, e := unix.Syscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
	return e
}

func errno32(r int32) string {
	if r < 0 {
		return unix.ErrnoName(unix.Errno(-r))
	}
	return "ok"
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.String()
	}
	return err.Error()
}
