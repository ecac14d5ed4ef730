package helper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/agent"
	"github.com/oac/sandbox-agent/host/provider"
)

// killWait bounds Kill's wait for the agent: its stop sends TERM, waits
// the bootstrap's grace (at most a minute), then KILL.
const killWait = 90 * time.Second

// inproc is the provider of helper mode: the guest is this process's own
// agent, joined to the host side by a socket pair. It creates nothing
// outside the process.
type inproc struct {
	agent agent.Config
}

func (p *inproc) Name() string                        { return "helper" }
func (p *inproc) Capabilities() provider.Capabilities { return provider.Capabilities{} }
func (p *inproc) Check(context.Context) error         { return nil }

func (p *inproc) Create(_ context.Context, _ provider.Spec) (provider.Instance, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	host, err := fileConn(fds[0], "host")
	if err != nil {
		unix.Close(fds[1])
		return nil, err
	}
	guest, err := fileConn(fds[1], "guest")
	if err != nil {
		host.Close()
		return nil, err
	}
	return &instance{cfg: p.agent, host: host, guest: guest, done: make(chan struct{}), accepted: make(chan struct{})}, nil
}

func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	return c, nil
}

type instance struct {
	cfg         agent.Config
	host, guest net.Conn

	mu       sync.Mutex
	started  bool
	cancel   context.CancelFunc
	done     chan struct{}
	err      error
	accepted chan struct{}
	once     sync.Once
}

// Start runs the agent on its end of the pair; Done closes when it
// returns.
func (i *instance) Start(context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.started {
		return errors.New("helper: the agent is already started")
	}
	i.started = true
	ctx, cancel := context.WithCancel(context.Background())
	i.cancel = cancel
	cfg := i.cfg
	cfg.Conn = i.guest
	go func() {
		err := agent.Run(ctx, cfg)
		i.guest.Close()
		i.mu.Lock()
		i.err = err
		i.mu.Unlock()
		close(i.done)
	}()
	return nil
}

// Accept returns the host's end once.
func (i *instance) Accept(ctx context.Context) (net.Conn, error) {
	select {
	case <-i.accepted:
		<-ctx.Done()
		return nil, ctx.Err()
	default:
	}
	close(i.accepted)
	return i.host, nil
}

func (i *instance) Done() <-chan struct{} { return i.done }

func (i *instance) Err() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.err
}

// Kill ends the agent: it stops every process it started (TERM, the grace,
// KILL) and returns; Kill waits for that.
func (i *instance) Kill() error {
	i.mu.Lock()
	started := i.started
	i.mu.Unlock()
	if !started {
		return nil
	}
	i.cancel()
	i.guest.Close()
	select {
	case <-i.done:
		return nil
	case <-time.After(killWait):
		return errors.New("helper: the agent did not stop")
	}
}

func (i *instance) Destroy() error {
	var err error
	i.once.Do(func() {
		err = i.Kill()
		i.host.Close()
		i.guest.Close()
	})
	return err
}
