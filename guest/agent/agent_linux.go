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
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/direct"
	"github.com/oac/sandbox-agent/guest/doors"
	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/health"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/netns"
	"github.com/oac/sandbox-agent/guest/privfile"
	"github.com/oac/sandbox-agent/guest/reaper"
	"github.com/oac/sandbox-agent/guest/supervise"
	"github.com/oac/sandbox-agent/guest/transparent"
	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/internal/errmark"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// ListenTimeout bounds the wait for the host's bridge on a unix+listen
// endpoint.
const ListenTimeout = 2 * time.Minute

// Config configures one agent run.
type Config struct {
	Endpoint transport.Endpoint
	// Conn, when set, is the transport already connected (oac-guest
	// helper: the host side runs in this process); Endpoint is then unused.
	Conn         net.Conn
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
	// OnTime, when set, sets the clock from the host's Time messages; the
	// agent then lists the "time" capability in Hello (VM guests).
	OnTime func(protocol.Time)
	// SetClock, when set, sets the wall clock for the host's Clock steps;
	// the agent then lists the "clock" capability in Hello, answers the
	// host's reads and steps, and reports the jumps it sees (VM guests:
	// SetRealtime).
	SetClock func(time.Time) error
	// OnState, when set, sees every State the agent reports to the host
	// (oac-guest tells systemd about them when it runs as a service).
	OnState func(protocol.State)
	// Confinement starts workload processes (package workload); nil:
	// decided by Run.
	Confinement *workload.Confinement
	// Shares are the contract's share mount points (a VM's virtio-fs
	// shares): never platform doors.
	Shares []string
	// OwnNetNS gives the workload a network namespace of its own with
	// only lo even when the guest's has nothing else (oac-guest helper:
	// a platform may carry sockets out with no interface, as libkrun's
	// socket impersonation does).
	OwnNetNS bool
}

// Run runs the agent until the host asks it to stop (returns nil), ctx is
// cancelled (orderly stop, returns nil) or the session fails.
func Run(ctx context.Context, cfg Config) error {
	if cfg.MinVersion == 0 {
		cfg.MinVersion, cfg.MaxVersion = protocol.MinVersion, protocol.MaxVersion
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
		if cfg.Endpoint.Scheme == transport.SchemeUnixListen {
			// The host execs its bridge once the Pod runs: an image
			// pull of a sibling, a busy API server.
			cfg.DialTimeout = ListenTimeout
		}
	}
	if cfg.Confinement == nil {
		cfg.Confinement = workload.Prepare(cfg.Log)
	}
	conn := cfg.Conn
	if conn == nil {
		var err error
		if conn, err = dialWithRetry(ctx, cfg.Endpoint, cfg.DialTimeout); err != nil {
			return err
		}
	}
	// Coalesce: each yamux frame in one write (fewer system calls and
	// wakeups of the host per frame).
	protocol.TuneTransport(conn)
	sess, err := yamux.Client(protocol.Coalesce(conn), protocol.MuxConfig(nil))
	if err != nil {
		conn.Close()
		return fmt.Errorf("start session: %w", err)
	}
	defer sess.Close()
	caps := append([]string{protocol.CapProcess, protocol.CapForward}, dataPlaneCaps(cfg.Endpoint)...)
	if cfg.OnTime != nil {
		caps = append(caps, protocol.CapTime)
	}
	if cfg.SetClock != nil {
		caps = append(caps, protocol.CapClock)
	}
	ctl, welcome, err := protocol.GuestHandshake(sess, protocol.Hello{
		MinVersion:   cfg.MinVersion,
		MaxVersion:   cfg.MaxVersion,
		AgentVersion: cfg.AgentVersion,
		PID:          os.Getpid(),
		Capabilities: caps,
	}, protocol.HelloTimeout)
	if err != nil {
		return err
	}
	where := cfg.Endpoint.String()
	if cfg.Conn != nil {
		where = "in-process"
	}
	cfg.Log.Info("connected", "endpoint", where, "protocol", welcome.Version, "host", welcome.HostVersion)
	if cfg.OnWelcome != nil {
		cfg.OnWelcome(welcome)
	}
	// Forward streams from the host (ingress to the workload's loopback
	// ports).
	wl := &workloadNet{}
	defer wl.close()
	hostStreams := make(chan struct{})
	go func() {
		serveHostStreams(ctx, sess, wl.dialLoopback, protocol.MaxStreams, cfg.Log)
		close(hostStreams)
	}()
	defer func() { sess.Close(); <-hostStreams }()
	a := &agent{
		cfg: cfg, sess: sess, ctl: ctl, welcome: welcome, wl: wl,
		procMsgs:   protocol.HasCapability(welcome.Capabilities, protocol.CapProcess),
		daemonExit: make(chan reaper.Exit, 1),
		superErr:   make(chan error, 1),
		healthc:    make(chan healthResult, 1),
		superStop:  func() {},
	}
	defer a.startClock(ctx)()
	a.data = a.newDataPlane(ctx)
	a.directCtx = ctx
	// Egress comes up beside the bootstrap, unless the workload may need
	// a network namespace of its own (the guest's has another interface):
	// then it waits for serve to decide, and serves in that namespace.
	if others, err := netns.Others(); err == nil && len(others) == 0 && !cfg.OwnNetNS {
		a.prepareEgress()
	} else {
		a.egressLate = true
	}
	defer func() {
		a.waitEgress()
		if a.transparent != nil {
			a.transparent.Close()
		}
		if a.proxies != nil {
			a.proxies.Close()
		}
		a.data.close()
	}()
	err = a.serve(ctx)
	// The last message (stopped, failed) is written; give the host up to
	// a second to read it and close the session. Closing at once races
	// the host's read: yamux may report the shutdown instead of the data.
	select {
	case <-sess.CloseChan():
	case <-time.After(time.Second):
	}
	return err
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

type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	logs   sync.WaitGroup
}

type healthResult struct {
	res health.Result
	err error
}

type agent struct {
	cfg      Config
	sess     *yamux.Session
	ctl      *protocol.Control
	boot     *bootstrap.Bootstrap
	procMsgs bool // the host accepts Process messages
	welcome  protocol.Welcome
	// clock answers the host's Clock messages (nil: no Config.SetClock).
	clock *guestClock
	// gate paces and bounds the egress and dns streams of the proxies and
	// the capture (the workload's connections).
	gate *protocol.StreamGate
	// proxies are the egress proxies, nil when the host offers no egress.
	proxies *egress.Proxies
	// transparent is the resolver and TCP capture, nil when the host does
	// not answer dns streams or the guest cannot set them up.
	transparent *transparent.Transparent
	// wl is the workload's network namespace: the proxies, the resolver
	// and the capture serve there, the health check and forwards dial
	// there, and the workload starts there.
	wl *workloadNet
	// data carries egress connections beside the session when the host
	// offered a data plane.
	data *dataPlane
	// egressDone is closed once the egress setup that started at Welcome
	// (prepareEgress) has ended; egressErr is the proxies' failure and
	// transparentMsg says how the capture went, for the host.
	egressDone     chan struct{}
	egressErr      error
	transparentMsg string
	// egressLate is set when the guest's network has an interface
	// besides lo: the egress setup then waits for the bootstrap, which
	// decides whether the workload gets a namespace of its own to serve.
	egressLate bool
	// pool is the resolver's made-up addresses, shared by the proxies.
	pool *transparent.Pool
	// exit is the guest's way out (egress.Exit), nil when the host offers
	// no egress.
	exit *egress.Exit
	// direct supervises the workload's trapped connects in direct mode
	// (nil when off), within directCtx (the agent's run).
	direct    *direct.Supervisor
	directCtx context.Context

	mu    sync.Mutex
	procs []*proc

	daemonExit chan reaper.Exit
	superErr   chan error
	healthc    chan healthResult
	// superStop stops oac-sandbox-io's supervisor and waits for it.
	superStop    func()
	healthCancel context.CancelFunc
	ready        bool
	hasFailed    bool
	// notes are what the launcher could not apply (see workload.Launch),
	// under mu.
	notes []string
}

// confinement describes how the workload is confined here, for the host.
func (a *agent) confinement() string {
	c := a.cfg.Confinement
	parts := []string{"workload: " + bootstrap.WorkloadFilter}
	if a.boot.SandboxIO != nil && a.boot.Daemon != nil {
		if ok, why := c.Isolated(); ok {
			parts = append(parts, "the daemon in a mount namespace of its own without oac-sandbox-io's private file")
		} else {
			parts = append(parts, "the daemon NOT kept from oac-sandbox-io's private file ("+why+")")
		}
	}
	if a.boot.SandboxIO != nil {
		parts = append(parts, "oac-sandbox-io not dumpable")
	}
	parts = append(parts, "limits: "+c.Limits())
	msg := strings.Join(parts, "; ")
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.notes) > 0 {
		msg += "; not applied: " + strings.Join(a.notes, "; ")
	}
	return msg
}

// owner owns the private file and the runtime directories.
var owner = privfile.Options{UID: bootstrap.DaemonUID, GID: bootstrap.DaemonGID}

// waitBootstrap reads the control stream until the Bootstrap. A warm
// sandbox's host (docs/warm.md) may wait long before it sends one: meanwhile
// it keeps a VM's clock (Clock, Time) and may stop the guest (Shutdown,
// answered with stopped: the returned frame is nil then).
func (a *agent) waitBootstrap() (*protocol.Frame, error) {
	for {
		f, err := a.ctl.Recv()
		if err != nil {
			return nil, fmt.Errorf("wait for Bootstrap: %w", err)
		}
		switch f.Type {
		case protocol.TypeBootstrap:
			return &f, nil
		case protocol.TypeShutdown:
			var s protocol.Shutdown
			_ = f.Decode(&s)
			_ = a.state(protocol.State{State: protocol.StateStopped, Message: s.Reason})
			return nil, nil
		case protocol.TypeClock:
			if err := a.clockFrame(f); err != nil {
				return nil, err
			}
		case protocol.TypeTime:
			var tm protocol.Time
			if err := f.Decode(&tm); err != nil {
				return nil, err
			}
			if a.cfg.OnTime != nil {
				a.cfg.OnTime(tm)
			}
		case protocol.TypeError:
			var e protocol.Error
			_ = f.Decode(&e)
			return nil, &protocol.PeerError{Err: e}
		default:
			return nil, fmt.Errorf("wait for Bootstrap: %w: got %s", protocol.ErrUnexpectedType, f.Type)
		}
	}
}

func (a *agent) serve(ctx context.Context) error {
	f, err := a.waitBootstrap()
	if err != nil {
		return err
	}
	if f == nil { // stopped before its bootstrap (a warm sandbox)
		return nil
	}
	b, err := bootstrap.Decode(bytes.NewReader(f.Body))
	if err == nil {
		if b.Sandbox != nil {
			// The operator's relaxation comes from the host's Welcome,
			// never from the document.
			b.Sandbox.AllowLoopbackLink = a.welcome.AllowLoopbackLink
		}
		err = b.ValidateInGuest()
	}
	if err != nil {
		a.fail(protocol.CodeBootstrap, err)
		return fmt.Errorf("bootstrap refused: %w", err)
	}
	a.boot = b
	if err := a.state(protocol.State{State: protocol.StateStarting, Message: "applying bootstrap"}); err != nil {
		return err
	}
	if cur, _ := os.Hostname(); b.Hostname != "" && b.Hostname != cur && a.cfg.SetHostname {
		if err := initsys.SetHostname(b.Hostname); errors.Is(err, unix.EPERM) {
			// A container's guest root may not hold CAP_SYS_ADMIN in its
			// UTS namespace: the runtime named it at create, which a warm
			// sandbox's claim comes after (docs/warm.md). The starting
			// event says so; nothing else depends on the name.
			n := "hostname " + b.Hostname + " (this runtime's guest root cannot set it; the runtime's name " + cur + " holds)"
			a.cfg.Log.Warn(n)
			a.mu.Lock()
			a.notes = append(a.notes, n)
			a.mu.Unlock()
		} else if err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
	}
	if b.SandboxIO != nil || b.Daemon != nil {
		if err := a.isolate(); err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
	}
	if b.SandboxIO != nil || b.Daemon != nil {
		if err := a.closeDoors(); err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
	}
	if a.egressLate {
		a.prepareEgress()
	}
	if b.SandboxIO == nil && b.Daemon == nil {
		// Nothing will run in the guest that could use egress: ready does
		// not wait for the proxies and the capture (they come up beside
		// it, and say how in the log).
		go func() {
			if err := a.waitEgress(); err != nil {
				a.cfg.Log.Warn("egress proxies unavailable", "err", err)
			}
		}()
	} else {
		if err := a.waitEgress(); err != nil {
			a.fail(protocol.CodeInternal, err)
			return err
		}
		if msg := a.transparentMsg; msg != "" {
			if err := a.state(protocol.State{State: protocol.StateStarting, Message: msg}); err != nil {
				return err
			}
		}
	}
	if err := a.startAll(ctx); err != nil {
		a.stopAll(b.Grace())
		a.fail(protocol.CodeInternal, err)
		return err
	}
	return a.loop(ctx)
}

// closeDoors finds the doors the platform opened to the host (package
// doors) and has every workload process close them in its own mount
// namespace; where the guest can give it none, the sandbox fails naming
// them: never a workload with a door open.
func (a *agent) closeDoors() error {
	src, err := doors.Scan(a.cfg.Shares)
	if err != nil {
		return fmt.Errorf("look for the platform's doors: %w", err)
	}
	found, plan := doors.Find(src)
	if len(found) == 0 {
		return nil
	}
	names := make([]string, len(found))
	for i, d := range found {
		names[i] = d.String()
		a.cfg.Log.Info("platform door", "kind", string(d.Kind), "path", d.Path, "what", d.What, "closed", d.Close)
	}
	if !doors.Enabled {
		a.cfg.Log.Warn("platform doors left open: this oac-guest was built with oac_doors_off, for tests only")
		return nil
	}
	if ok, why := a.cfg.Confinement.Isolated(); !ok && !plan.Empty() {
		return errmark.With(workload.ErrDoorsOpen, fmt.Errorf("the platform opened doors to the host that this guest cannot close for the workload (%s): %s; "+
			"close them in the platform's configuration (a WSL distribution: /etc/wsl.conf, see docs/platform-doors.md)", why, strings.Join(names, "; ")))
	}
	a.cfg.Confinement.SetDoors(plan)
	return a.state(protocol.State{State: protocol.StateStarting, Message: "platform doors closed for the workload: " + strings.Join(names, "; ")})
}

// prepareEgress starts the proxies, the resolver and the capture in the
// background as soon as the host has offered them (Welcome), beside each
// other: the boot waits for them only before the workload starts, after
// the bootstrap arrived.
func (a *agent) prepareEgress() {
	a.egressDone = make(chan struct{})
	caps := a.welcome.Capabilities
	if !protocol.HasCapability(caps, protocol.CapEgress) {
		close(a.egressDone)
		return
	}
	a.gate = protocol.NewStreamGate(a.sess)
	if protocol.HasCapability(caps, protocol.CapAbort) {
		a.gate.OnAbort = func(id uint32) {
			_ = a.ctl.SendWithin(protocol.TypeAbort, protocol.Abort{Stream: id}, time.Second)
		}
	}
	var unmap func(string) string
	if protocol.HasCapability(caps, protocol.CapDNS) {
		// The resolver's made-up addresses map back to their names on
		// every path: a client that resolves itself (curl --socks5) and
		// then names the address to a proxy reaches the name.
		a.pool = transparent.NewPool(transparent.DefaultPrefix)
		unmap = a.pool.Unmap
	}
	// The guest's one way out, for the proxies and the capture alike: the
	// data plane's carriers, then the session's streams. A new carrier is
	// one more entry here.
	a.exit = egress.NewExit(unmap, append(a.data.carriers(), egress.SessionCarrier(a.gate))...)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p, err := egress.StartWith(a.wl.get().Listen, a.exit, egress.HTTPAddr, egress.SOCKSAddr, a.cfg.Log)
		if err != nil {
			a.egressErr = err
			return
		}
		a.proxies = p
		a.cfg.Log.Info("egress proxies listening", "http", p.HTTPAddr, "socks5", p.SOCKSAddr)
	}()
	if protocol.HasCapability(caps, protocol.CapDNS) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.transparentMsg = a.startTransparent()
			if msg := a.startDirect(); msg != "" {
				a.transparentMsg += "; " + msg
			}
		}()
	}
	go func() {
		wg.Wait()
		close(a.egressDone)
	}()
}

// waitEgress waits for prepareEgress; the error is the proxies'.
func (a *agent) waitEgress() error {
	if a.egressDone == nil { // never started: serve ended before it
		return nil
	}
	<-a.egressDone
	return a.egressErr
}

// startTransparent starts the resolver and the capture of outgoing TCP
// and points /etc/resolv.conf at the resolver. A guest that cannot (no
// CAP_NET_ADMIN, a kernel without nf_tables, a real network interface)
// keeps the proxies; the returned message says which, for the host.
func (a *agent) startTransparent() string {
	udpLog := &udpReporter{a: a}
	t, err := transparent.Start(transparent.Config{
		Exit:  a.exit,
		Ask:   transparent.SessionAsker(a.gate),
		Log:   a.cfg.Log,
		Pool:  a.pool,
		NetNS: a.wl.get(),
		OnUDPDropped: func(n uint64) {
			udpLog.report(n)
		},
	})
	if err != nil {
		a.cfg.Log.Warn("transparent egress unavailable; the proxies still work", "err", err)
		return "transparent egress unavailable (programs must use the proxies): " + err.Error()
	}
	a.transparent = t
	// Families: "IPv4 and IPv6", or "IPv4 only (IPv6 not captured: why)".
	msg := "transparent egress: resolver on " + t.DNS.Addr + ", outgoing TCP captured (" + t.Families + ")"
	if how, err := initsys.PlaceResolvConf("/etc/resolv.conf", protocol.ResolvConf, "/run/oac"); err != nil {
		a.cfg.Log.Warn("resolv.conf not placed", "err", err)
		msg += "; /etc/resolv.conf not placed (" + err.Error() + ")"
	} else {
		a.cfg.Log.Info("resolv.conf", "action", how)
	}
	a.cfg.Log.Info(msg, "capture", t.CaptureAddr)
	return msg
}

// udpReporter tells the host, on a log stream of its own, how many UDP
// datagrams were dropped: UDP other than DNS never leaves the guest.
type udpReporter struct {
	a  *agent
	mu sync.Mutex
	st net.Conn
}

func (u *udpReporter) report(n uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.st == nil {
		st, err := protocol.OpenStream(u.a.sess, protocol.StreamHeader{Kind: protocol.KindLog, Name: "oac-guest/egress"})
		if err != nil {
			return
		}
		u.st = st
	}
	_, _ = fmt.Fprintf(u.st, "udp denied: %d datagram(s) dropped: UDP other than DNS is not carried out of the sandbox (only TCP, through the host's egress policy; DNS is answered by the guest's resolver)\n", n)
}

// startAll prepares the runtime directories and the private file, starts
// oac-sandbox-io and the daemon, reports "bootstrap complete" and starts
// the health check (or reports ready at once without one).
func (a *agent) startAll(ctx context.Context) error {
	b := a.boot
	if b.SandboxIO != nil || b.Daemon != nil {
		// Best effort: a read-only image without /home or /environment
		// still runs; the private file below is not best effort.
		for _, d := range []string{bootstrap.RuntimeHome, bootstrap.WorkspaceDir} {
			if err := privfile.EnsureDir(d, owner); err != nil {
				a.cfg.Log.Warn("runtime directory unavailable", "dir", d, "err", err)
			}
		}
	}
	var started []string
	if b.SandboxIO != nil {
		if err := a.prepareSandboxIOFile(b); err != nil {
			return errmark.With(errSandboxIO, err)
		}
		if err := a.superviseSandboxIO(ctx); err != nil {
			return errmark.With(errSandboxIO, err)
		}
		started = append(started, "oac-sandbox-io")
	}
	if b.Daemon != nil {
		env := b.DaemonEnviron()
		if a.proxies != nil {
			// Only the daemon: oac-sandbox-io starts with an empty environment.
			env = egress.WithProxyEnv(env, a.proxies.Env())
		}
		var mask []string
		if b.SandboxIO != nil {
			mask = []string{bootstrap.SandboxIOFile}
		}
		p, err := a.start(workload.Spec{Name: "daemon", Argv: b.Daemon.Argv, Env: env, Dir: a.daemonDir(b.Daemon), Mask: mask}, 0, func(e reaper.Exit) {
			a.daemonExit <- e
		})
		if err != nil {
			return errmark.With(errDaemon, err)
		}
		a.cfg.Log.Debug("daemon started", "pid", p.cmd.Process.Pid)
		started = append(started, "the daemon")
	}
	if len(started) > 0 {
		if err := a.state(protocol.State{State: protocol.StateStarting, Message: a.confinement()}); err != nil {
			return err
		}
		msg := "bootstrap complete: " + strings.Join(started, " and ") + " started"
		if err := a.state(protocol.State{State: protocol.StateStarting, Message: msg}); err != nil {
			return err
		}
	}
	if h := b.Health; h != nil {
		hctx, cancel := context.WithCancel(ctx)
		a.healthCancel = cancel
		c := health.Check{
			URL:      h.BaseURL() + h.URLPath(),
			Username: b.Credentials.User(), Password: b.Credentials.Password,
			Interval: h.Every(), Timeout: h.PerRequest(), Deadline: h.GiveUpAfter(),
			Dial: a.wl.get().DialContext,
		}
		go func() {
			res, err := health.Wait(hctx, c)
			a.healthc <- healthResult{res, err}
		}()
		return nil
	}
	return a.reportReady("")
}

func (a *agent) reportReady(msg string) error {
	a.ready = true
	// The boot did not wait for the data plane; it comes up now, or at
	// the first connection if that is sooner.
	a.data.begin()
	st := protocol.State{State: protocol.StateReady, Message: msg}
	if c := a.boot.Credentials; c != nil {
		st.Username = c.User()
	}
	if h := a.boot.Health; h != nil {
		st.URL = h.BaseURL()
	}
	return a.state(st)
}

// prepareSandboxIOFile writes the private file from the bootstrap, or
// reads and validates the one a provider placed.
func (a *agent) prepareSandboxIOFile(b *bootstrap.Bootstrap) error {
	if s := b.SandboxIO.Bootstrap; s != nil {
		data, err := s.Encode()
		if err != nil {
			return err
		}
		if err := privfile.Write(bootstrap.SandboxIOFile, data, owner); err != nil {
			return fmt.Errorf("sandbox_io: %w", err)
		}
		a.cfg.Log.Info("wrote the private bootstrap file", "path", bootstrap.SandboxIOFile, "bytes", len(data))
		return nil
	}
	data, err := privfile.Read(bootstrap.SandboxIOFile, bootstrap.MaxSandboxIOSize, owner)
	if err != nil {
		return fmt.Errorf("sandbox_io: provided file: %w", err)
	}
	s, err := bootstrap.DecodeSandboxIO(data)
	if err == nil {
		err = s.Validate(b.Sandbox)
	}
	if err != nil {
		return fmt.Errorf("sandbox_io: provided file %s: %w", bootstrap.SandboxIOFile, err)
	}
	return nil
}

// superviseSandboxIO starts oac-sandbox-io exactly as the contract says
// and keeps it running; it returns once the first start succeeded or
// failed.
func (a *agent) superviseSandboxIO(ctx context.Context) error {
	const name = "oac-sandbox-io"
	path := a.boot.SandboxIO.BinaryPath()
	dir := "/"
	if st, err := os.Stat(bootstrap.WorkspaceDir); err == nil && st.IsDir() {
		dir = bootstrap.WorkspaceDir
	}
	first := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	s := &supervise.Supervisor{
		Name: name,
		Start: func(restarts int) (supervise.Run, error) {
			exited := make(chan supervise.Exit, 1)
			p, err := a.start(workload.Spec{Name: name, Argv: bootstrap.SandboxIOArgv(path), Env: []string{}, Dir: dir, NoDump: true}, restarts, func(e reaper.Exit) {
				exited <- toSuperviseExit(e)
			})
			if restarts == 0 {
				first <- err
			}
			if err != nil {
				return supervise.Run{}, err
			}
			return supervise.Run{PID: p.cmd.Process.Pid, Exited: exited}, nil
		},
		// Exit 2 is a usage error: restarting cannot fix it.
		Fatal: func(e supervise.Exit) bool { return e.Signal == "" && e.Code == 2 },
		Restarting: func(r supervise.Restart) {
			a.cfg.Log.Info("restarting", "process", name, "in", r.In.String(), "restarts", r.Restarts, "after", r.Exit.String())
			a.reportProcess(protocol.ProcessStatus{Name: name, Restarts: r.Restarts, RestartInMS: r.In.Milliseconds()})
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Run(sctx); err != nil {
			if errors.Is(err, supervise.ErrFatal) {
				err = fmt.Errorf("%w (exit status 2 is a usage error: check how it is started)", err)
			}
			select {
			case a.superErr <- err:
			default:
			}
		}
	}()
	a.superStop = func() { cancel(); <-done }
	return <-first
}

func toSuperviseExit(e reaper.Exit) supervise.Exit {
	if e.Status.Signaled() {
		return supervise.Exit{Code: -1, Signal: e.Status.Signal().String()}
	}
	return supervise.Exit{Code: e.Status.ExitStatus()}
}

func (a *agent) daemonDir(p *bootstrap.Process) string {
	if p.Dir != "" {
		return p.Dir
	}
	for _, d := range []string{bootstrap.WorkspaceDir, bootstrap.RuntimeHome} {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
	}
	return "/"
}

// state sends a State message.
func (a *agent) state(st protocol.State) error {
	if a.cfg.OnState != nil {
		a.cfg.OnState(st)
	}
	if err := a.ctl.Send(protocol.TypeState, st); err != nil {
		return fmt.Errorf("report state: %w", err)
	}
	return nil
}

// reportProcess sends a Process message when the host accepts them.
func (a *agent) reportProcess(ps protocol.ProcessStatus) {
	if a.procMsgs {
		_ = a.ctl.Send(protocol.TypeProcess, ps)
	}
}

// Kinds of failure the agent marks where they happen (errmark), for
// reasonOf.
var (
	errSandboxIO = errors.New("oac-sandbox-io failed")
	errDaemon    = errors.New("the daemon failed")
)

// reasonOf names the part that failed for the host (protocol.Reason*).
func reasonOf(err error) string {
	switch {
	case errors.Is(err, bootstrap.ErrInvalid):
		return protocol.ReasonBootstrap
	case errors.Is(err, workload.ErrDoorsOpen):
		return protocol.ReasonPlatformDoor
	case errors.Is(err, health.ErrUnhealthy):
		return protocol.ReasonDaemonUnhealthy
	case errors.Is(err, errDaemon):
		return protocol.ReasonDaemonFailed
	case errors.Is(err, errSandboxIO), errors.Is(err, supervise.ErrFatal):
		return protocol.ReasonSandboxIO
	}
	return protocol.ReasonGuest
}

// fail reports an error to the host; failures to send are moot.
func (a *agent) fail(code string, err error) {
	_ = a.state(protocol.State{State: protocol.StateFailed, Message: err.Error(), Reason: reasonOf(err)})
	_ = a.ctl.Send(protocol.TypeError, protocol.Error{Code: code, Message: err.Error()})
}

// failed reports a failure of the running sandbox. The host answers with
// Shutdown, which stops everything in order.
func (a *agent) failed(err error) error {
	if a.hasFailed {
		return nil
	}
	a.hasFailed = true
	if a.healthCancel != nil {
		a.healthCancel()
	}
	return a.state(protocol.State{State: protocol.StateFailed, Message: err.Error(), Reason: reasonOf(err)})
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
		var err error
		select {
		case <-ctx.Done():
			a.stopAll(a.boot.Grace())
			_ = a.state(protocol.State{State: protocol.StateStopped, Message: "agent received a stop signal"})
			return nil
		case e := <-a.daemonExit:
			if a.ready {
				err = a.failed(errmark.With(errDaemon, errors.New("daemon exited: "+e.String())))
			} else {
				err = a.failed(errmark.With(errDaemon, errors.New("daemon exited before it was healthy: "+e.String())))
			}
		case serr := <-a.superErr:
			err = a.failed(errmark.With(errSandboxIO, serr))
		case hr := <-a.healthc:
			switch {
			case a.hasFailed:
			case hr.err != nil:
				err = a.failed(hr.err)
			default:
				err = a.reportReady(fmt.Sprintf("daemon healthy after %d attempt(s) in %s", hr.res.Attempts, hr.res.Took.Round(time.Millisecond)))
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
				_ = a.state(protocol.State{State: protocol.StateStopped, Message: s.Reason})
				return nil
			case protocol.TypeClock:
				if err := a.clockFrame(f); err != nil {
					a.stopAll(a.boot.Grace())
					return err
				}
			case protocol.TypeTime:
				var tm protocol.Time
				if err := f.Decode(&tm); err != nil {
					a.stopAll(a.boot.Grace())
					return err
				}
				if a.cfg.OnTime != nil {
					a.cfg.OnTime(tm)
				} else {
					a.cfg.Log.Warn("the host sent Time, which this agent did not ask for; ignored")
				}
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
		if err != nil {
			a.stopAll(a.boot.Grace())
			return err
		}
	}
}

// start starts a workload process as the runtime user (no supplementary
// groups, new session, no-new-privileges, the workload's seccomp filter and
// limits; package workload's launcher applies them) with its output
// streamed to the host, and reports it. onExit runs once with the exit
// status, after the exit was reported.
func (a *agent) start(s workload.Spec, restarts int, onExit func(reaper.Exit)) (*proc, error) {
	name := s.Name
	path, err := exec.LookPath(s.Argv[0])
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s.Path, s.UID, s.GID = path, bootstrap.DaemonUID, bootstrap.DaemonGID
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("start %s: open %s: %w", name, os.DevNull, err)
	}
	defer devnull.Close()
	var closeAfterStart, closeOnError []*os.File
	defer func() {
		for _, f := range closeAfterStart {
			f.Close()
		}
	}()
	failed := func(err error) (*proc, error) {
		for _, f := range closeOnError {
			f.Close()
		}
		return nil, fmt.Errorf("start %s (%s) as %d:%d: %w", name, s.Argv[0], bootstrap.DaemonUID, bootstrap.DaemonGID, err)
	}
	var stdio [2]*os.File
	for i := range stdio {
		r, w, err := os.Pipe()
		if err != nil {
			return failed(fmt.Errorf("pipe: %w", err))
		}
		stdio[i] = w
		closeAfterStart = append(closeAfterStart, w)
		closeOnError = append(closeOnError, r)
	}
	var cmd *exec.Cmd
	var exitc <-chan reaper.Exit
	for {
		l, err := a.cfg.Confinement.Command(s)
		if err != nil {
			return failed(err)
		}
		cmd = l.Cmd
		cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, stdio[0], stdio[1]
		exitc, err = a.cfg.Reaper.Start(cmd, reaper.Options{NoNewPrivs: true, NetNS: a.wl.get().File()})
		l.Started()
		if err != nil {
			l.Close()
			if a.cfg.Confinement.Fallback(err) {
				continue
			}
			return failed(err)
		}
		notes, err := l.Finish()
		if err == nil {
			a.superviseDirect(name, l.Listener)
		}
		a.mu.Lock()
		for _, n := range notes {
			if !slices.Contains(a.notes, n) {
				a.cfg.Log.Warn(n, "process", name)
				a.notes = append(a.notes, n)
			}
		}
		a.mu.Unlock()
		if err != nil {
			// The launcher exits right after saying why.
			select {
			case <-exitc:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exitc
			}
			return failed(err)
		}
		break
	}
	pr := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	for i, suffix := range []string{"stdout", "stderr"} {
		pr.logs.Add(1)
		go a.streamLog(name+"/"+suffix, closeOnError[i], &pr.logs)
	}
	a.mu.Lock()
	live := a.procs[:0]
	for _, p := range a.procs {
		select {
		case <-p.exited:
		default:
			live = append(live, p)
		}
	}
	a.procs = append(live, pr)
	a.mu.Unlock()
	pid := cmd.Process.Pid
	a.cfg.Log.Info("started", "process", name, "pid", pid, "restarts", restarts)
	a.reportProcess(protocol.ProcessStatus{Name: name, PID: pid, Running: true, Restarts: restarts})
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
		a.cfg.Log.Info("exited", "process", name, "pid", e.PID, "status", e.String())
		ps := protocol.ProcessStatus{Name: name, PID: e.PID}
		if e.Status.Signaled() {
			ps.Signal = e.Status.Signal().String()
		} else {
			code := e.Status.ExitStatus()
			ps.ExitCode = &code
		}
		a.reportProcess(ps)
		close(pr.exited)
		onExit(e)
	}()
	return pr, nil
}

// streamLog copies one output pipe to a log stream; when no stream can be
// opened it copies to the agent's stderr so output is never silently lost.
// The stream applies backpressure: a process writing faster than the host
// reads blocks on its pipe, so the agent never buffers unbounded output.
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

// stopAll stops oac-sandbox-io's supervisor (nothing is restarted from
// here on), sends SIGTERM to every process group, waits up to grace, then
// sends SIGKILL and waits for the exits to be reaped and reported.
func (a *agent) stopAll(grace time.Duration) {
	if a.healthCancel != nil {
		a.healthCancel()
	}
	a.superStop()
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
