package provider

import (
	"os/exec"
	"sync"
	"time"
)

// KillWait is how long Kill waits for a killed runtime to exit.
const KillWait = 10 * time.Second

// Waiter is a started runtime as Process sees it: an *exec.Cmd (see
// Process.Start) or anything else that ends (see Process.Watch).
type Waiter interface {
	// Wait returns when the runtime has exited, nil for a clean exit. It
	// is called once.
	Wait() error
	// Kill ends the runtime at once. Process ignores its error: whether
	// the runtime ended is Wait's to say.
	Kill() error
	// Pid is the runtime's host pid, 0 when it has none.
	Pid() int
}

// Process is the runtime of an Instance: it watches the runtime until it
// exits and implements Done, Err, Kill and HostPID for it.
type Process struct {
	exit     func(error) error
	stuck    error
	killWait time.Duration

	mu   sync.Mutex
	w    Waiter
	done chan struct{}
	err  error
}

// NewProcess returns a Process not started yet. exit phrases the runtime's
// exit for Err: it gets Wait's error, nil for a clean exit, and must not
// return nil. stuck is Kill's error when the runtime has not exited
// KillWait after it was killed.
func NewProcess(exit func(error) error, stuck error) *Process {
	return &Process{exit: exit, stuck: stuck, killWait: KillWait, done: make(chan struct{})}
}

// Start starts cmd and watches it. Its error is cmd.Start's.
func (p *Process) Start(cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	p.Watch(cmdWaiter{cmd})
	return nil
}

// Watch watches a started runtime: when its Wait returns, Err says why and
// Done is closed. A Process watches one runtime.
func (p *Process) Watch(w Waiter) {
	p.mu.Lock()
	if p.w != nil {
		p.mu.Unlock()
		panic("provider: Process started twice")
	}
	p.w = w
	p.mu.Unlock()
	go func() {
		err := p.exit(w.Wait())
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
}

// Started reports whether Start or Watch was called.
func (p *Process) Started() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w != nil
}

// Done is closed when the runtime has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err says why the runtime exited; nil while it runs.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// HostPID returns the runtime's host pid, 0 before Start.
func (p *Process) HostPID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil {
		return 0
	}
	return p.w.Pid()
}

// Kill kills a running runtime and waits up to KillWait for it to exit.
// It returns nil when the runtime was never started or has exited.
func (p *Process) Kill() error {
	p.mu.Lock()
	w := p.w
	p.mu.Unlock()
	if w == nil {
		return nil
	}
	return p.KillWith(func() error {
		_ = w.Kill()
		return nil
	})
}

// KillAsking first asks the runtime to stop what it runs (a container
// runtime's kill, which takes the container's pid namespace down), gives
// the process up to grace to exit on its own, then kills it as Kill does.
// It returns nil when the runtime was never started or has exited.
func (p *Process) KillAsking(ask func(), grace time.Duration) error {
	if !p.Started() {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	ask()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	return p.Kill()
}

// KillWith is Kill with the caller's way of ending the runtime, started
// or not: unless the runtime has exited, it calls kill; an error from kill
// is returned at once, else it waits up to KillWait for the exit.
func (p *Process) KillWith(kill func() error) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := kill(); err != nil {
		return err
	}
	t := time.NewTimer(p.killWait)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return p.stuck
	}
}

// cmdWaiter is a started *exec.Cmd.
type cmdWaiter struct{ cmd *exec.Cmd }

func (c cmdWaiter) Wait() error { return c.cmd.Wait() }
func (c cmdWaiter) Kill() error { return c.cmd.Process.Kill() }
func (c cmdWaiter) Pid() int    { return c.cmd.Process.Pid }
