package provider

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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

// Process is the lifecycle every Instance embeds: it watches the runtime
// until it exits, hands out the guest's connection from the listener the
// provider made, kills the runtime, and on Destroy releases what Create
// claimed. An Instance that embeds it implements Accept, Done, Err, Kill
// and Destroy through it and writes only Start.
type Process struct {
	exit     func(error) error
	stuck    error
	killWait time.Duration

	startMu sync.Mutex // serializes StartOnce

	mu       sync.Mutex
	w        Waiter
	done     chan struct{}
	err      error
	ln       net.Listener
	carriers []string
	kill     func() error
	releases []func() error
}

// NewProcess returns a Process not started yet. exit phrases the runtime's
// exit for Err: it gets Wait's error, nil for a clean exit, and must not
// return nil. stuck is Kill's error when the runtime has not exited
// KillWait after it was killed.
func NewProcess(exit func(error) error, stuck error) *Process {
	return &Process{exit: exit, stuck: stuck, killWait: KillWait, done: make(chan struct{})}
}

// Exits phrases a runtime's exit for NewProcess: clean for a clean exit,
// "what: Wait's error" otherwise.
func Exits(clean, what string) func(error) error {
	return func(err error) error {
		if err == nil {
			return errors.New(clean)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
}

// StartOnce runs an Instance's start, which starts the runtime, once:
// it fails when the runtime was started already (what names the provider
// in the error), and one StartOnce runs at a time.
func (p *Process) StartOnce(what string, start func() error) error {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if p.Started() {
		return fmt.Errorf("%s: already started", what)
	}
	return start()
}

// Start starts cmd and watches it. Its error is cmd.Start's.
func (p *Process) Start(cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	p.Watch(cmdWaiter{cmd})
	return nil
}

// StartPiped starts cmd with its stdout and stderr on a pipe of the
// Process's own, copied to w (nothing when w is nil). A runtime's
// container inherits them: with a pipe the runtime's exit is seen when it
// exits (os/exec would otherwise wait for the container to close them).
func (p *Process) StartPiped(cmd *exec.Cmd, w io.Writer) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("output pipe: %w", err)
	}
	defer pw.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		return err
	}
	out := Output(w)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer pr.Close()
		_, _ = io.Copy(out, pr)
	}()
	p.Watch(pipedWaiter{cmdWaiter{cmd}, copied})
	return nil
}

// OutputWait bounds the wait for a piped runtime's last output after it
// exited: what it ran may hold the pipe while it dies (a sandbox's
// processes), which must not hold the exit back; output that comes at
// once (the runtime's own last words) is in Spec.Stderr when Done closes.
const OutputWait = 250 * time.Millisecond

type pipedWaiter struct {
	cmdWaiter
	copied <-chan struct{}
}

func (w pipedWaiter) Wait() error {
	err := w.cmd.Wait()
	t := time.NewTimer(OutputWait)
	defer t.Stop()
	select {
	case <-w.copied:
	case <-t.C:
	}
	return err
}

// Output is w, or io.Discard when w is nil (Spec.Stderr is optional).
func Output(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
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
	done := p.done
	p.mu.Unlock()
	go func() {
		err := p.exit(w.Wait())
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
}

// Started reports whether Start or Watch was called.
func (p *Process) Started() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w != nil
}

// Done is closed when the runtime has exited.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

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

// KillBy makes Kill end the runtime with kill instead of killing its
// process at once (a container runtime asked first, a machine stopped).
func (p *Process) KillBy(kill func() error) {
	p.mu.Lock()
	p.kill = kill
	p.mu.Unlock()
}

// Kill ends a running runtime and waits up to KillWait for it to exit:
// with the function given to KillBy, else by killing its process. It
// returns nil when the runtime was never started or has exited.
func (p *Process) Kill() error {
	p.mu.Lock()
	kill := p.kill
	p.mu.Unlock()
	if kill != nil {
		return kill()
	}
	return p.KillProcess()
}

// KillProcess kills the runtime's process at once, whatever KillBy says,
// and waits up to KillWait for it to exit. It returns nil when the
// runtime was never started or has exited.
func (p *Process) KillProcess() error {
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
// the process up to grace to exit on its own, then kills its process.
// It returns nil when the runtime was never started or has exited.
func (p *Process) KillAsking(ask func(), grace time.Duration) error {
	if !p.Started() {
		return nil
	}
	done := p.Done()
	select {
	case <-done:
		return nil
	default:
	}
	ask()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	return p.KillProcess()
}

// KillWith is Kill with the caller's way of ending the runtime, started
// or not: unless the runtime has exited, it calls kill; an error from kill
// is returned at once, else it waits up to KillWait for the exit.
func (p *Process) KillWith(kill func() error) error {
	done := p.Done()
	select {
	case <-done:
		return nil
	default:
	}
	if err := kill(); err != nil {
		return err
	}
	t := time.NewTimer(p.killWait)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return p.stuck
	}
}

// OnDestroy adds a step to Destroy: what Create claimed, released after
// the runtime was killed. Steps run last added first.
func (p *Process) OnDestroy(release func() error) {
	p.mu.Lock()
	p.releases = append(p.releases, release)
	p.mu.Unlock()
}

// Own makes Destroy close c (a listener, a descriptor, a lock); its
// error is not reported.
func (p *Process) Own(c io.Closer) {
	p.OnDestroy(func() error {
		_ = c.Close()
		return nil
	})
}

// DestroyOnError is deferred by a Create with a named error result: when
// *err is set, it releases what the Create had claimed.
func (p *Process) DestroyOnError(err *error) {
	if *err != nil {
		_ = p.Destroy()
	}
}

// Destroy kills the runtime and then releases what OnDestroy and Own were
// given, each once, and returns the errors joined. It is safe to call more
// than once, and to call on a Create that failed half-way.
func (p *Process) Destroy() error {
	err := p.Kill()
	p.mu.Lock()
	steps := p.releases
	p.releases = nil
	p.mu.Unlock()
	for i := len(steps) - 1; i >= 0; i-- {
		err = errors.Join(err, steps[i]())
	}
	return err
}

// cmdWaiter is a started *exec.Cmd.
type cmdWaiter struct{ cmd *exec.Cmd }

func (c cmdWaiter) Wait() error { return c.cmd.Wait() }
func (c cmdWaiter) Kill() error { return c.cmd.Process.Kill() }
func (c cmdWaiter) Pid() int    { return c.cmd.Process.Pid }
