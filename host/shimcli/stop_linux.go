package shimcli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/kept"
)

type shimSignal = unix.Signal

const (
	sigTerm = unix.SIGTERM
	sigKill = unix.SIGKILL
)

// procStart is when process pid started, in clock ticks after boot
// (/proc/PID/stat's 22nd field).
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, errors.New("unreadable /proc stat")
	}
	return strconv.ParseUint(string(f[19]), 10, 64) // field 22: the 20th after the name
}

// selfStart is this process's procStart (0 when unreadable).
func selfStart() uint64 {
	s, _ := procStart(os.Getpid())
	return s
}

// shimProc is the process proven to be a sandbox's shim: a pidfd opened
// first, then the pid's start time found to be the recorded one. A process
// that had the pid when the pidfd was opened and still has it with the
// shim's start time is the shim, and the pidfd names that process only
// (never one that reuses the pid later).
type shimProc struct{ fd int }

// openShim proves the shim of rec; errShimGone when its process has
// exited (its pid free, or another process's now).
func openShim(rec kept.ShimRecord) (*shimProc, error) {
	if rec.ProcStart == 0 {
		return nil, errors.New("its record gives no process start time to prove the shim by")
	}
	fd, err := unix.PidfdOpen(rec.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, errShimGone
	}
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", rec.PID, err)
	}
	start, err := procStart(rec.PID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		err = errShimGone
	case err != nil:
		err = fmt.Errorf("pid %d: %w", rec.PID, err)
	case start != rec.ProcStart:
		err = errShimGone // and another process has its pid
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &shimProc{fd: fd}, nil
}

// signal sends sig to the shim; errShimGone when it has exited.
func (p *shimProc) signal(sig shimSignal) error {
	err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return errShimGone
	}
	return err
}

// exited reports whether the shim's process has ended (a pidfd is
// readable once its process has exited).
func (p *shimProc) exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

func (p *shimProc) close() { unix.Close(p.fd) }
