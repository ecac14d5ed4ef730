//go:build linux

package reaper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Exit is the final status of a process started with Start.
type Exit struct {
	PID    int
	Status unix.WaitStatus
}

// Code returns the exit code, or -1 if the process was killed by a signal.
func (e Exit) Code() int {
	if e.Status.Exited() {
		return e.Status.ExitStatus()
	}
	return -1
}

// String describes the exit like "exit status 3" or "killed by signal terminated".
func (e Exit) String() string {
	if e.Status.Signaled() {
		return "killed by signal " + e.Status.Signal().String()
	}
	return fmt.Sprintf("exit status %d", e.Status.ExitStatus())
}

// Reaper reaps every child of this process.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan Exit
	orphans atomic.Uint64
	sigs    chan os.Signal
	done    chan struct{}
}

// New starts the reap loop. Call it once per process, before starting any
// child.
func New() *Reaper {
	r := &Reaper{
		waiters: make(map[int]chan Exit),
		sigs:    make(chan os.Signal, 1),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

// BecomeSubreaper makes this process adopt orphaned descendants, so Reaper
// sees them even when it is not PID 1.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	return nil
}

// Orphans returns how many processes not started by Start have been reaped.
func (r *Reaper) Orphans() uint64 { return r.orphans.Load() }

// Close stops the reap loop.
func (r *Reaper) Close() {
	signal.Stop(r.sigs)
	close(r.done)
}

func (r *Reaper) loop() {
	for {
		select {
		case <-r.sigs:
			r.reap()
		case <-r.done:
			return
		}
	}
}

func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD or nothing more to reap now
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- Exit{PID: pid, Status: ws}
			continue
		}
		r.orphans.Add(1)
	}
}

// Options for Start.
type Options struct {
	// NoNewPrivs sets PR_SET_NO_NEW_PRIVS for the child (and only the
	// child): it can never gain privileges through execve of a setuid or
	// file-capability binary.
	NoNewPrivs bool
	// NetNS, when set, is a network namespace (an open nsfs file) the
	// child starts in: the starting thread enters it (setns) before the
	// fork, so the child is in it from its first instruction.
	NetNS *os.File
}

// Start starts cmd and returns a channel that receives its exit exactly
// once. The caller must not call cmd.Wait. cmd's Stdin, Stdout and Stderr
// must be nil or *os.File: other writers need the copy goroutines that only
// cmd.Wait finishes.
func (r *Reaper) Start(cmd *exec.Cmd, opts Options) (<-chan Exit, error) {
	for _, s := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		if s == nil {
			continue
		}
		if _, ok := s.(*os.File); !ok {
			return nil, errors.New("reaper: stdio of a reaped command must be nil or *os.File")
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if opts.NoNewPrivs || opts.NetNS != nil {
		err = startOnThread(cmd, opts)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return nil, err
	}
	ch := make(chan Exit, 1)
	r.waiters[cmd.Process.Pid] = ch
	// The SIGCHLD for a child that already exited may have been consumed
	// by a reap pass that ran before we registered it; run one more pass.
	select {
	case r.sigs <- unix.SIGCHLD:
	default:
	}
	return ch, nil
}

// startOnThread forks from a dedicated OS thread that has
// PR_SET_NO_NEW_PRIVS set and has entered opts.NetNS (as asked). Both are
// per thread and inherited by the child; the thread is never returned to
// the Go scheduler (the goroutine exits while locked, so the runtime
// destroys it), so no other code of the agent runs with them. The main
// thread is never used: the runtime cannot destroy it, so they would stay
// with the agent (and with threads cloned from it).
func startOnThread(cmd *exec.Cmd, opts Options) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Holding the main thread, try again: the new goroutine
			// cannot be scheduled on a thread locked to this one.
			errc <- startOnThread(cmd, opts)
			runtime.UnlockOSThread()
			return
		}
		// no UnlockOSThread: the thread dies with this goroutine.
		if opts.NetNS != nil {
			if err := unix.Setns(int(opts.NetNS.Fd()), unix.CLONE_NEWNET); err != nil {
				errc <- fmt.Errorf("enter the network namespace: %w", err)
				return
			}
		}
		if opts.NoNewPrivs {
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				errc <- fmt.Errorf("set no_new_privs: %w", err)
				return
			}
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
