package bwrap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// leftoverWait bounds the wait for a killed leftover to be gone.
const leftoverWait = 5 * time.Second

// killLeftovers kills what a killed shim's sandbox of the state directory
// dir left running: the processes of the bwrap executable bwrap whose
// arguments name a path below dir. bwrap's --die-with-parent is set by each bwrap process itself,
// after it starts: a shim killed in that window (the crash point
// boot/runtime-started finds it) leaves the sandbox's inner bwrap, pid 1
// of its pid namespace, orphaned and waiting forever. Its death ends
// that namespace. The caller holds dir's claim, so no live shim runs a
// sandbox of it. Each process is reached by pidfd, its arguments read
// again through it, so a reused pid is never signalled; only processes
// this one may signal are looked at. It returns how many it killed.
func killLeftovers(dir, bwrap string) (int, error) {
	exe, err := os.Stat(bwrap)
	if err != nil {
		return 0, fmt.Errorf("leftovers of %s: %w", dir, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list /proc: %w", err)
	}
	prefix := []byte(dir + "/")
	self := os.Getpid()
	var killed []int
	var errs []error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !namesDir(pid, prefix) || !runs(pid, exe) {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if namesDir(pid, prefix) && runs(pid, exe) { // still the same process: the pidfd holds it
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("kill leftover process %d of %s: %w", pid, dir, err))
			} else {
				killed = append(killed, fd)
				continue
			}
		}
		unix.Close(fd)
	}
	deadline := time.Now().Add(leftoverWait)
	for _, fd := range killed {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			ms := int(time.Until(deadline).Milliseconds())
			if ms <= 0 {
				errs = append(errs, fmt.Errorf("a leftover process of %s outlived SIGKILL by %s", dir, leftoverWait))
				break
			}
			n, err := unix.Poll(fds, ms)
			if n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
				break // exited (the pidfd is readable), or it cannot be told
			}
		}
		unix.Close(fd)
	}
	return len(killed), errors.Join(errs...)
}

// namesDir reports whether an argument of process pid begins with prefix.
func namesDir(pid int, prefix []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, arg := range bytes.Split(b, []byte{0}) {
		if bytes.HasPrefix(arg, prefix) {
			return true
		}
	}
	return false
}

// runs reports whether process pid runs the executable exe.
func runs(pid int, exe os.FileInfo) bool {
	st, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/exe")
	return err == nil && os.SameFile(st, exe)
}
