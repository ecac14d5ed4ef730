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

// signalShim sends sig to the shim rec describes, once proven to be that
// process: a pidfd is opened first, then the pid's start time must be the
// recorded one. A process that had the pid when the pidfd was opened and
// still has it with the shim's start time is the shim, and the pidfd
// signals that process only (never one that reuses the pid later).
func signalShim(rec kept.ShimRecord, sig shimSignal) error {
	if rec.ProcStart == 0 {
		return errors.New("its record gives no process start time to prove the shim by")
	}
	fd, err := unix.PidfdOpen(rec.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return errShimGone
	}
	if err != nil {
		return fmt.Errorf("pid %d: %w", rec.PID, err)
	}
	defer unix.Close(fd)
	start, err := procStart(rec.PID)
	if errors.Is(err, fs.ErrNotExist) {
		return errShimGone
	}
	if err != nil {
		return fmt.Errorf("pid %d: %w", rec.PID, err)
	}
	if start != rec.ProcStart {
		// The shim is gone and another process has its pid.
		return errShimGone
	}
	err = unix.PidfdSendSignal(fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return errShimGone
	}
	return err
}
