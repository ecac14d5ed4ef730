package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/reaper"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// Config configures one agent run.
type Config struct {
	Endpoint     transport.Endpoint
	AgentVersion string
	// MinVersion and MaxVersion default to the protocol package's range.
	MinVersion, MaxVersion int
	Reaper                 *reaper.Reaper
	Log                    *slog.Logger
	// DialTimeout bounds how long the agent retries connecting to the host.
	DialTimeout time.Duration
	// SetHostname applies Bootstrap.Hostname; false outside a UTS namespace.
	SetHostname bool
	// OnWelcome, when set, is called once the host has accepted the
	// session, before the Bootstrap is read (a VM guest sets its clock
	// from Welcome.TimeUnixNano here).
	OnWelcome func(protocol.Welcome)
}

// ErrShutdown is returned by Run after an orderly stop.
var ErrShutdown = errors.New("agent stopped")

// Run runs the agent until the host asks it to stop (returns nil), ctx is
// cancelled (orderly stop, returns nil) or the session fails.
func Run(ctx context.Context, cfg Config) error {
	if cfg.MinVersion == 0 {
		cfg.MinVersion, cfg.MaxVersion = protocol.MinVersion, protocol.MaxVersion
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	conn, err := dialWithRetry(ctx, cfg.Endpoint, cfg.DialTimeout)
	if err != nil {
		return err
	}
	sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
	if err != nil {
		conn.Close()
		return fmt.Errorf("start session: %w", err)
	}
	defer endSession(sess)
	ctl, welcome, err := protocol.GuestHandshake(sess, protocol.Hello{
		MinVersion:   cfg.MinVersion,
		MaxVersion:   cfg.MaxVersion,
		AgentVersion: cfg.AgentVersion,
		PID:          os.Getpid(),
	}, protocol.HelloTimeout)
	if err != nil {
		return err
	}
	cfg.Log.Info("connected", "endpoint", cfg.Endpoint.String(), "protocol", welcome.Version, "host", welcome.HostVersion)
	if cfg.OnWelcome != nil {
		cfg.OnWelcome(welcome)
	}
	a := &agent{cfg: cfg, sess: sess, ctl: ctl, welcome: welcome, exits: make(chan procExit, 4)}
	defer func() {
		if a.proxies != nil {
			a.proxies.Close()
		}
	}()
	return a.serve(ctx)
}

// endGrace bounds how long the agent waits for the host to close the
// session after the agent's last message.
const endGrace = 2 * time.Second

// endSession ends the session in order: the host closes it once it has
// read our last message; closing first could discard that message (an
// AF_UNIX peer closing with unread data resets the connection).
func endSession(sess *yamux.Session) {
	select {
	case <-sess.CloseChan():
	case <-time.After(endGrace):
	}
	sess.Close()
}

func dialWithRetry(ctx context.Context, ep transport.Endpoint, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		c, err := ep.Dial(ctx)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to host at %s: %w (is oac-shim listening?)", ep, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

type procExit struct {
	name string
	exit reaper.Exit
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	logs   sync.WaitGroup
}

type agent struct {
	cfg     Config
	sess    *yamux.Session
	ctl     *protocol.Control
	welcome protocol.Welcome
	// proxies are the egress proxies, nil when the host offers no egress.
	proxies *egress.Proxies
	boot    *bootstrap.Bootstrap
	mu      sync.Mutex
	procs   []*proc
	exits   chan procExit
}

func (a *agent) serve(ctx context.Context) error {
	f, err := a.ctl.Recv()
	if err != nil {
		return fmt.Errorf("wait for Bootstrap: %w", err)
	}
	if f.Type != protocol.TypeBootstrap {
		return fmt.Errorf("wait for Bootstrap: %w: got %s", protocol.ErrUnexpectedType, f.Type)
	}
	b, err := bootstrap.Decode(bytes.NewReader(f.Body))
	if err == nil {
		err = b.Validate()
	}
	if err != nil {
		a.fail(protocol.CodeBootstrap, err)
		return fmt.Errorf("bootstrap refused: %w", err)
	}
	a.boot = b
	if err := a.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStarting}); err != nil {
		return fmt.Errorf("report state: %w", err)
	}
	if cur, _ := os.Hostname(); b.Hostname != "" && b.Hostname != cur && a.cfg.SetHostname {
		if err := initsys.SetHostname(b.Hostname); err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
	}
	if slices.Contains(a.welcome.Capabilities, protocol.CapEgress) {
		p, err := egress.Start(egress.SessionOpener(a.sess), egress.HTTPAddr, egress.SOCKSAddr, a.cfg.Log)
		if err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
		a.proxies = p
		a.cfg.Log.Info("egress proxies listening", "http", p.HTTPAddr, "socks5", p.SOCKSAddr)
	}
	ready := protocol.State{State: protocol.StateReady}
	if b.Daemon != nil {
		p, err := a.start("daemon", b.Daemon)
		if err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
		ready.Process = &protocol.ProcessStatus{Name: p.name, PID: p.cmd.Process.Pid, Running: true}
	}
	if err := a.ctl.Send(protocol.TypeState, ready); err != nil {
		a.stopAll(b.Grace())
		return fmt.Errorf("report state: %w", err)
	}
	return a.loop(ctx)
}

// fail reports an error to the host; failures to send are moot.
func (a *agent) fail(code string, err error) {
	_ = a.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateFailed, Message: err.Error()})
	_ = a.ctl.Send(protocol.TypeError, protocol.Error{Code: code, Message: err.Error()})
}

func (a *agent) loop(ctx context.Context) error {
	frames := make(chan protocol.Frame)
	recvErr := make(chan error, 1)
	go func() {
		for {
			f, err := a.ctl.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			frames <- f
		}
	}()
	for {
		select {
		case <-ctx.Done():
			a.stopAll(a.boot.Grace())
			_ = a.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped, Message: "agent received a stop signal"})
			return nil
		case pe := <-a.exits:
			code := pe.exit.Code()
			st := protocol.State{
				State:   protocol.StateFailed,
				Message: fmt.Sprintf("%s exited: %s", pe.name, pe.exit),
				Process: &protocol.ProcessStatus{Name: pe.name, PID: pe.exit.PID, ExitCode: &code},
			}
			if pe.exit.Status.Signaled() {
				st.Process.ExitCode = nil
				st.Process.Signal = pe.exit.Status.Signal().String()
			}
			if err := a.ctl.Send(protocol.TypeState, st); err != nil {
				a.stopAll(a.boot.Grace())
				return fmt.Errorf("report state: %w", err)
			}
		case f := <-frames:
			switch f.Type {
			case protocol.TypeShutdown:
				var s protocol.Shutdown
				if err := f.Decode(&s); err != nil {
					a.stopAll(a.boot.Grace())
					return err
				}
				grace := a.boot.Grace()
				if s.GraceMS > 0 && time.Duration(s.GraceMS)*time.Millisecond < grace {
					grace = time.Duration(s.GraceMS) * time.Millisecond
				}
				a.stopAll(grace)
				_ = a.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped, Message: s.Reason})
				return nil
			case protocol.TypeError:
				var e protocol.Error
				_ = f.Decode(&e)
				a.stopAll(a.boot.Grace())
				return &protocol.PeerError{Err: e}
			default:
				a.stopAll(a.boot.Grace())
				err := fmt.Errorf("%w: %s on the control stream", protocol.ErrUnexpectedType, f.Type)
				_ = a.ctl.Send(protocol.TypeError, protocol.Error{Code: protocol.CodeProtocol, Message: err.Error()})
				return err
			}
		case err := <-recvErr:
			a.stopAll(a.boot.Grace())
			if errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, yamux.ErrStreamClosed) {
				return errors.New("host connection lost: stopped all processes")
			}
			return fmt.Errorf("control stream: %w", err)
		}
	}
}

// start starts p as the runtime user with its output streamed to the host.
func (a *agent) start(name string, p *bootstrap.Process) (*proc, error) {
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Args = p.Argv
	cmd.Env = p.Environ()
	if a.proxies != nil {
		cmd.Env = egress.WithProxyEnv(cmd.Env, a.proxies.Env())
	}
	cmd.Dir = p.Dir
	if cmd.Dir == "" {
		cmd.Dir = defaultDir()
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if os.Getuid() != bootstrap.DaemonUID {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: bootstrap.DaemonUID, Gid: bootstrap.DaemonGID, Groups: []uint32{}}
	}
	// else: a single-uid sandbox, where the agent already is the runtime
	// user and has no privilege to switch or drop groups.
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("start %s: open %s: %w", name, os.DevNull, err)
	}
	defer devnull.Close()
	cmd.Stdin = devnull
	pr := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	var closeAfterStart []*os.File
	for _, fd := range []struct {
		suffix string
		set    func(*os.File)
	}{{"stdout", func(f *os.File) { cmd.Stdout = f }}, {"stderr", func(f *os.File) { cmd.Stderr = f }}} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("start %s: pipe: %w", name, err)
		}
		fd.set(w)
		closeAfterStart = append(closeAfterStart, w)
		pr.logs.Add(1)
		go a.streamLog(name+"/"+fd.suffix, r, &pr.logs)
	}
	exitc, err := a.cfg.Reaper.Start(cmd, reaper.Options{NoNewPrivs: true})
	for _, f := range closeAfterStart {
		f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("start %s (%s) as %d:%d: %w", name, p.Argv[0], bootstrap.DaemonUID, bootstrap.DaemonGID, err)
	}
	a.mu.Lock()
	a.procs = append(a.procs, pr)
	a.mu.Unlock()
	a.cfg.Log.Info("started", "process", name, "pid", cmd.Process.Pid)
	go func() {
		e := <-exitc
		// Deliver the output before the exit is reported, but do not wait
		// for a background grandchild that still holds the pipes open.
		logsDone := make(chan struct{})
		go func() { pr.logs.Wait(); close(logsDone) }()
		select {
		case <-logsDone:
		case <-time.After(250 * time.Millisecond):
		}
		close(pr.exited)
		a.cfg.Log.Info("exited", "process", name, "pid", e.PID, "status", e.String())
		select {
		case a.exits <- procExit{name: name, exit: e}:
		default:
			// Exit reports are best effort once the agent is stopping.
		}
	}()
	return pr, nil
}

func defaultDir() string {
	for _, d := range []string{bootstrap.WorkspaceDir, bootstrap.RuntimeHome} {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
	}
	return "/"
}

// streamLog copies one output pipe to a log stream; when no stream can be
// opened it copies to the agent's stderr so output is never silently lost.
func (a *agent) streamLog(name string, r *os.File, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	var w io.Writer = os.Stderr
	st, err := protocol.OpenStream(a.sess, protocol.StreamHeader{Kind: protocol.KindLog, Name: name})
	if err == nil {
		defer st.Close()
		w = st
	} else {
		a.cfg.Log.Warn("log stream unavailable, writing to stderr", "stream", name, "err", err)
	}
	_, _ = io.Copy(w, r)
}

// stopAll sends SIGTERM to every process group, waits up to grace, then
// sends SIGKILL and waits for the exits to be reaped.
func (a *agent) stopAll(grace time.Duration) {
	a.mu.Lock()
	procs := append([]*proc(nil), a.procs...)
	a.mu.Unlock()
	signalAll := func(sig syscall.Signal) {
		for _, p := range procs {
			select {
			case <-p.exited:
			default:
				_ = syscall.Kill(-p.cmd.Process.Pid, sig)
			}
		}
	}
	waitAll := func(d time.Duration) bool {
		deadline := time.After(d)
		for _, p := range procs {
			select {
			case <-p.exited:
			case <-deadline:
				return false
			}
		}
		return true
	}
	signalAll(syscall.SIGTERM)
	if waitAll(grace) {
		return
	}
	a.cfg.Log.Warn("grace expired, killing", "grace", grace.String())
	signalAll(syscall.SIGKILL)
	waitAll(5 * time.Second)
}
