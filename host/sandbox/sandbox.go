package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/directguard"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/muxguard"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/volmount"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/internal/crashpoint"
	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Defaults.
const (
	DefaultBootTimeout = 30 * time.Second
	// stopMargin is added to the guest's grace before the runtime is
	// killed: a stop request ends in a killed runtime at the latest
	// grace + stopMargin after it arrived, whatever the guest does.
	stopMargin = time.Second
	// handshakeExitWait is how long a guest that failed the handshake
	// gets to exit on its own.
	handshakeExitWait = 2 * time.Second
	// maxGuestText bounds a guest-supplied message copied into an event.
	maxGuestText = 1024
	// DefaultStreamHeaderTimeout bounds the time from a guest opening a
	// stream to its complete StreamHeader.
	DefaultStreamHeaderTimeout = 5 * time.Second
	// shutdownSendTimeout bounds the write of Shutdown to a guest that
	// does not read its control stream.
	shutdownSendTimeout = time.Second
)

// Config configures one sandbox run.
type Config struct {
	Name      string
	Provider  provider.Provider
	AgentPath string
	Rootfs    string
	// Bootstrap is sent to the guest; nil sends an empty one (no daemon).
	// With Warm, it is the claim's instead; this one only carries the
	// operator's AllowLoopbackLink (Sandbox) and the stop grace.
	Bootstrap *bootstrap.Bootstrap
	// Warm, when set, boots the guest for nobody: after the handshake the
	// run reports StateWarm and waits for a claim (Warm.Claims), whose
	// bootstrap it then sends as any run does; or it stops at the warm
	// maximum age, when the guest misbehaves, or when ctx ends
	// (docs/warm.md).
	Warm   *Warm
	Events api.Sink
	Log    *slog.Logger
	// Diag receives the runtime's and the agent's diagnostics, prefixed.
	Diag io.Writer
	// BootTimeout bounds the time from start to ready.
	BootTimeout time.Duration
	// MinVersion and MaxVersion override the protocol range (tests).
	MinVersion, MaxVersion int
	// Egress answers the guest's egress streams; nil offers no egress (the
	// guest starts no proxies and its egress streams are refused).
	Egress *egress.Broker
	// SandboxIOPath is a host binary the provider installs as
	// /usr/local/bin/oac-sandbox-io; Install are more host binaries for
	// /usr/local/bin, by name (see provider.Spec).
	SandboxIOPath string
	Install       map[string]string
	// Volumes replace the guest's /home or /environment (provider.Spec).
	Volumes map[string]string
	// Keep, when set, runs a kept sandbox (provider.Spec.Keep): what it
	// writes outlives the run. The provider must implement
	// provider.Keeper.
	Keep *provider.Keep
	// PasswordFile, when set, receives the daemon's password (0600,
	// created exclusively) once the bootstrap is valid: the way a caller
	// learns a password the shim generated. Events never carry it.
	PasswordFile string
	// PasswordOut, when set, is handed the daemon's password the same way
	// (a descriptor the caller reads: no file on disk). An error fails the
	// start before anything is created.
	PasswordOut func(password string) error
	// Attach, when set, is called with the live session once the guest
	// has connected and negotiated, and with nil when the session ends
	// (before the runtime is destroyed). Forwards and the control API use
	// it; it must not block.
	Attach func(*Session)
	// MapURL, when set, maps the daemon URL the guest reports when ready
	// (inside the guest, e.g. http://127.0.0.1:4096) to one the host can
	// use (a forward's address); "" keeps the guest's URL. The ready event
	// then carries both: url (the host's) and guest_url.
	MapURL func(guestURL string) string

	// Bounds a hostile guest meets. Zero takes the production default;
	// tests shorten them (docs/threat-model.md).
	//
	// HelloTimeout: transport connect to a complete Hello
	// (protocol.HelloTimeout). FrameBodyTimeout: a control frame's header
	// to the end of its body (protocol.FrameBodyTimeout).
	// StreamHeaderTimeout: a stream's open to its complete header
	// (DefaultStreamHeaderTimeout). KeepAliveInterval and
	// ConnectionWriteTimeout: the session's keepalive (a guest that stops
	// reading or answering is cut off within about their sum; see
	// protocol.MuxConfig).
	HelloTimeout           time.Duration
	FrameBodyTimeout       time.Duration
	StreamHeaderTimeout    time.Duration
	KeepAliveInterval      time.Duration
	ConnectionWriteTimeout time.Duration
	// Guard bounds the guest's yamux frames (package muxguard): streams
	// open at once (counting streams the host closed that the guest has
	// not: yamux keeps them, with whatever the guest wrote into their
	// receive window, until both sides closed), open and ping rates,
	// windows, the session's receive budget, the write timeout. A guest
	// over one is hostile: the sandbox fails and the runtime is killed.
	// Zero fields take muxguard.DefaultLimits.
	Guard muxguard.Limits
	// DataPlane restricts the data plane the host offers (see package
	// host/dataplane): "" (and DataPlaneDirect, the same) offers every
	// carrier the provider's transport allows and direct mode
	// (protocol.CapDataDirect) wherever every guarantee holds,
	// DataPlaneOff none (every connection is an egress stream of the
	// session), protocol.CapDataFD or protocol.CapDataDial that one only,
	// when allowed, without direct mode.
	DataPlane string
	// ClockInterval is how often the host reads a VM guest's clock and
	// steps it when off (see clock.go); 0 takes DefaultClockInterval, a
	// negative value turns clock keeping off. Guests sharing the host's
	// kernel are never touched (provider.Capabilities' OwnClock).
	ClockInterval time.Duration
}

// Warm configures a warm run.
type Warm struct {
	// MaxAge stops a warm sandbox nobody claimed (0: no limit).
	MaxAge time.Duration
	// Claims delivers claims; the run takes the first whose bootstrap it
	// can use.
	Claims <-chan Claim
}

// Claim hands a warm run the tenant's bootstrap.
type Claim struct {
	// Bootstrap is the tenant's, already decoded; the run validates it as
	// at the start of any run.
	Bootstrap *bootstrap.Bootstrap
	// Volumes are mounted at their guest directories before the bootstrap
	// is sent (checked by the caller: provider.CheckClaimVolumes).
	Volumes []volmount.Volume
	// Taken receives one value: nil when the run took the claim (the
	// bootstrap goes to the guest next), or why it refused it (nothing of
	// it reached the guest; the sandbox stays warm). It must be buffered.
	Taken chan<- error
}

// ErrNotWarm refuses a claim of a sandbox that is not (or no longer)
// warm.
var ErrNotWarm = errors.New("this sandbox is not warm: only a sandbox started with --warm and not yet claimed takes a claim")

// Config.DataPlane's values beside the carriers' names.
const (
	// DataPlaneOff: no data plane.
	DataPlaneOff = "off"
	// DataPlaneDirect: what "" offers, named: every carrier, and the
	// workload's connects answered with the host's own sealed sockets
	// wherever every guarantee holds (docs/egress.md, "Direct mode").
	DataPlaneDirect = "direct"
)

// ErrHostileGuest is wrapped by the error of a sandbox ended because its
// guest exceeded a bound no correct guest reaches (the failure kind of
// package failure, code hostile_guest).
var ErrHostileGuest = failure.ErrHostileGuest

// Run runs the sandbox until ctx is cancelled (then it stops the guest in
// order and returns nil) or the sandbox fails (it returns the reason). The
// last event is always a state event: stopped or failed.
func Run(ctx context.Context, cfg Config) error {
	s := &run{cfg: cfg, frames: make(chan protocol.Frame, 16), recvErr: make(chan error, 1), quit: make(chan struct{}), dataViolation: make(chan error, 1)}
	if s.cfg.Log == nil {
		s.cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.cfg.Events == nil {
		s.cfg.Events = api.Func(func(api.Event) {})
	}
	if s.cfg.BootTimeout == 0 {
		s.cfg.BootTimeout = DefaultBootTimeout
	}
	if s.cfg.MinVersion == 0 {
		s.cfg.MinVersion, s.cfg.MaxVersion = protocol.MinVersion, protocol.MaxVersion
	}
	if s.cfg.Bootstrap == nil {
		s.cfg.Bootstrap = &bootstrap.Bootstrap{Version: bootstrap.Version}
	}
	// An explicit HelloTimeout is the bound; by default the Hello may take
	// until the boot timeout (a VM's transport connects when qemu starts,
	// long before the kernel has booted the agent).
	s.helloUntilBoot = s.cfg.HelloTimeout <= 0
	if s.cfg.HelloTimeout <= 0 {
		s.cfg.HelloTimeout = protocol.HelloTimeout
	}
	if s.cfg.StreamHeaderTimeout <= 0 {
		s.cfg.StreamHeaderTimeout = DefaultStreamHeaderTimeout
	}
	s.aborts = map[uint32]context.CancelCauseFunc{}
	s.diag = newDiagWriter(cfg.Diag, "["+cfg.Name+"] ")
	s.warn = limitWarnings(s.cfg.Log)
	s.logs = newLogBudget(time.Now)
	s.egressEv = newEventLimit(EgressEventRate, EgressEventBurst, api.KindEgressDropped, "egress events over the rate limit were dropped")
	s.processEv = newEventLimit(ProcessEventRate, ProcessEventBurst, api.KindProcessDropped, "process events over the rate limit were dropped")
	err := s.run(ctx)
	// Every goroutine of the run has ended and every egress connection is
	// closed: the drop counts, then the final state, are the last events.
	s.reportDrops()
	s.emitFinal()
	return err
}

type run struct {
	cfg   Config
	diag  *diagWriter
	inst  provider.Instance
	guard *muxguard.Conn
	sess  *yamux.Session
	// transport is the guest's connection as the provider accepted it
	// (a warm claim's volumes enter its peer's mount namespace).
	transport net.Conn
	ctl       *protocol.Control
	frames    chan protocol.Frame
	recvErr   chan error
	// quit is closed when nobody reads frames any more.
	quit chan struct{}

	// guestDone: the guest said it stopped or failed for good, or is gone.
	guestDone bool
	// helloUntilBoot: no HelloTimeout was given; the Hello may take until
	// the boot timeout.
	helloUntilBoot bool
	// egressCtx ends in-flight egress dials when the sandbox run ends.
	egressCtx    context.Context
	egressCancel context.CancelFunc
	// session is what Attach was given; the data plane's fd channel joins
	// it once it is up.
	session *Session
	// phases times the boot (debug log).
	phases phases
	// dataViolation receives how the guest broke the data plane's
	// protocol (it fails as hostile).
	dataViolation chan error
	// dataOffer are the data plane carriers Welcome offered, dataToken
	// their token.
	dataOffer []string
	dataToken string
	// direct is direct mode's guard when it was offered; directOff says
	// why it was not, when it was asked for.
	direct    *directguard.Guard
	directOff string
	// clock keeps a VM guest's clock (clock.go); nil when the run does
	// not. stopClock stops it.
	clock     *clockKeeper
	stopClock func()

	mu    sync.Mutex
	state api.State
	// final is the terminal state event, emitted by emitFinal once
	// everything else of the run has ended.
	final *api.Event
	// warn logs what the guest made the host refuse, rate limited.
	warn *slog.Logger
	// aborts ends an egress stream the guest aborted, by stream id.
	aborts map[uint32]context.CancelCauseFunc
	// logs, egressEv and processEv bound the events the guest causes.
	logs                *logBudget
	egressEv, processEv *eventLimit
	wg                  sync.WaitGroup
}

func (s *run) emit(e api.Event) {
	e.Time = time.Now().UTC()
	e.Sandbox = s.cfg.Name
	s.cfg.Events.Emit(e)
}

// emitEgress emits an egress event within EgressEventRate.
func (s *run) emitEgress(e api.Event) {
	if s.egressEv.allow() {
		s.emit(e)
	}
}

// reportDrops emits the counts of events dropped since the last call.
func (s *run) reportDrops() {
	if d := s.logs.takeDropped(); d > 0 {
		s.emit(api.Event{Event: api.KindDropped, Dropped: d, Message: "guest output over the log rate limit was dropped"})
	}
	s.egressEv.report(s.emit)
	s.processEv.report(s.emit)
}

// reportDropsEverySecond runs reportDrops every second until quit.
func (s *run) reportDropsEverySecond() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.reportDrops()
		case <-s.quit:
			return
		}
	}
}

// setState emits a state event; terminal states are final, and held back
// until the run has ended (emitFinal).
func (s *run) setState(state api.State, msg string) { s.setStateCode(state, msg, "") }

// setStateCode is setState with the failure code of a failed state.
func (s *run) setStateCode(state api.State, msg, code string) {
	s.mu.Lock()
	if s.state == api.StateFailed || s.state == api.StateStopped || s.state == state && state != api.StateStarting {
		s.mu.Unlock()
		return
	}
	s.state = state
	e := api.Event{Event: api.KindState, State: state, Message: msg, Code: code}
	if state == api.StateFailed || state == api.StateStopped {
		s.final = &e
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.emit(e)
}

// emitFinal emits the terminal state event.
func (s *run) emitFinal() {
	s.mu.Lock()
	e := s.final
	s.final = nil
	s.mu.Unlock()
	if e != nil {
		s.emit(*e)
	}
}

// guardErr returns the guard's violation, made the sandbox's failure
// reason, or nil.
// allowLink allows the Link's host and port, the one destination
// oac-sandbox-io must reach, without a rule of the operator's, and says
// so: a sandbox whose operator forgot the Link would be ready and never
// serve.
func (s *run) allowLink(b *bootstrap.Bootstrap) {
	if s.cfg.Egress == nil || b.SandboxIO == nil || b.SandboxIO.Bootstrap == nil {
		return
	}
	rule, err := s.cfg.Egress.AllowLink(b.SandboxIO.Bootstrap.LinkURL)
	if err != nil {
		s.setState(api.StateStarting, "egress: "+err.Error()+"; oac-sandbox-io reaches its Link only through a rule of yours")
		return
	}
	s.setState(api.StateStarting, "egress: the Link is allowed by default ("+rule+"): the one destination oac-sandbox-io must reach; every other destination needs a rule")
}

func (s *run) guardErr() error {
	if s.guard == nil {
		return nil
	}
	err := s.guard.Err()
	switch {
	case errors.Is(err, muxguard.ErrHostile):
		return failure.With(failure.ErrHostileGuest, err)
	case err != nil:
		return failure.With(failure.ErrRuntimeFailed, err)
	}
	return nil
}

// fail reports err as the failed state, with its failure code.
func (s *run) fail(err error) error {
	s.setStateCode(api.StateFailed, err.Error(), failure.Code(err))
	return err
}

func (s *run) run(ctx context.Context) error {
	b := s.cfg.Bootstrap
	if s.cfg.Warm == nil {
		if err := b.Validate(); err != nil {
			return s.fail(fmt.Errorf("invalid bootstrap, nothing created: %w", err))
		}
	}
	spec := provider.Spec{
		Name: s.cfg.Name, AgentPath: s.cfg.AgentPath, Rootfs: s.cfg.Rootfs, Hostname: b.Hostname, Stderr: s.diag,
		SandboxIOPath: s.cfg.SandboxIOPath, Install: s.cfg.Install, Volumes: s.cfg.Volumes, Keep: s.cfg.Keep,
	}
	if err := provider.CheckSpec(s.cfg.Provider, spec); err != nil {
		return s.fail(fmt.Errorf("nothing created: %w", err))
	}
	if s.cfg.Warm == nil {
		var err error
		if b, err = s.takeBootstrap(b); err != nil {
			return s.fail(fmt.Errorf("nothing created: %w", err))
		}
		s.cfg.Bootstrap = b
	}
	s.setState(api.StateStarting, "creating sandbox")
	if s.cfg.Warm == nil {
		s.allowLink(b)
	}
	s.phases.mark("")
	inst, err := s.cfg.Provider.Create(ctx, spec)
	s.phases.mark("create")
	if err != nil {
		return s.fail(failure.With(failure.ErrRuntimeFailed, fmt.Errorf("create %s sandbox: %w", s.cfg.Provider.Name(), err)))
	}
	s.inst = inst
	crashpoint.Hit(crashpoint.BootCreated)
	if c, ok := inst.(provider.ImageChecker); ok {
		if msg := c.ImageChanged(); msg != "" {
			s.cfg.Log.Warn(msg, "sandbox", s.cfg.Name)
			s.emit(api.Event{Event: api.KindKept, Message: msg})
		}
	}
	s.egressCtx, s.egressCancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.reportDropsEverySecond()
	defer func() {
		if s.cfg.Attach != nil && s.ctl != nil {
			s.cfg.Attach(nil)
		}
		if s.stopClock != nil {
			s.stopClock()
		}
		close(s.quit)
		s.egressCancel()
		if s.sess != nil {
			s.sess.Close()
		}
		if err := inst.Destroy(); err != nil {
			s.cfg.Log.Warn("destroy", "sandbox", s.cfg.Name, "err", err)
		}
		s.wg.Wait()
		s.closeDirect()
	}()
	start := time.Now()
	err = inst.Start(ctx)
	s.phases.mark("start runtime")
	if err != nil {
		return s.fail(failure.With(failure.ErrRuntimeFailed, fmt.Errorf("start %s sandbox: %w", s.cfg.Provider.Name(), err)))
	}
	crashpoint.Hit(crashpoint.BootStarted)
	bootCtx, cancelBoot := context.WithTimeout(ctx, s.cfg.BootTimeout)
	defer cancelBoot()
	conn, err := inst.Accept(bootCtx)
	s.phases.mark("guest connects")
	if err != nil {
		if ctx.Err() != nil {
			_ = inst.Kill()
			s.setState(api.StateStopped, "stopped before the guest connected: "+stopReason(ctx))
			return nil
		}
		kind := failure.ErrRuntimeFailed
		if bootCtx.Err() != nil {
			kind = failure.ErrBootTimeout
		}
		return s.fail(failure.With(kind, s.withDiag(fmt.Errorf("guest did not connect: %w", err))))
	}
	helloWait := s.cfg.HelloTimeout
	if s.helloUntilBoot {
		helloWait = max(helloWait, time.Until(start.Add(s.cfg.BootTimeout)))
	}
	err = s.handshake(ctx, conn, helloWait)
	s.phases.mark("handshake")
	if err != nil {
		// A stop closes the session under the guard, which may still be
		// judging a frame it has taken off the transport: the outcome is
		// decided once the session's reader has ended (yamux's Close
		// waits for its receive loop, the guard's only reader), so a
		// violation the host received before the stop is never reported
		// as a stop.
		if s.sess != nil {
			s.sess.Close()
		}
		if gerr := s.guardErr(); errors.Is(gerr, ErrHostileGuest) {
			_ = s.inst.Kill()
			return s.fail(fmt.Errorf("handshake with guest: %w", gerr))
		}
		if ctx.Err() != nil {
			_ = s.inst.Kill()
			s.setState(api.StateStopped, "stopped during the handshake with the guest: "+stopReason(ctx))
			return nil
		}
		// A guest that refused the handshake exits on its own (its
		// session is closed): give it a moment so its own account of the
		// failure reaches the diagnostics before the runtime is killed.
		select {
		case <-s.inst.Done():
		case <-time.After(handshakeExitWait):
		}
		kind := failure.ErrRuntimeFailed
		if isTimeout(err) {
			kind = failure.ErrBootTimeout
		}
		return s.fail(failure.With(kind, s.withDiag(err)))
	}
	s.wg.Add(1)
	go s.acceptStreams()
	s.wg.Add(1)
	go s.readControl()
	if s.cfg.Warm != nil {
		claimed, err := s.waitClaim(ctx)
		if err != nil {
			if errors.Is(err, ErrHostileGuest) || errors.Is(err, muxguard.ErrStalled) {
				_ = s.inst.Kill()
				s.sess.Close()
				return s.fail(err)
			}
			if !s.guestDone {
				s.shutdown("warm sandbox failed")
			}
			s.sess.Close()
			s.waitExit(stopMargin)
			return s.fail(err)
		}
		if claimed == nil { // stopped while warm
			return nil
		}
		b = claimed
		s.cfg.Bootstrap = b
		crashpoint.Hit(crashpoint.ClaimTaken)
		// The boot's clock restarts at the claim: warm waiting is not
		// booting.
		cancelBoot()
		start = time.Now()
		bootCtx, cancelBoot = context.WithTimeout(ctx, s.cfg.BootTimeout)
		defer cancelBoot()
	}
	body, err := json.Marshal(b)
	if err != nil {
		return s.fail(fmt.Errorf("encode bootstrap: %w", err))
	}
	if err := s.ctl.Send(protocol.TypeBootstrap, json.RawMessage(body)); err != nil {
		return s.fail(failure.With(failure.ErrRuntimeFailed, fmt.Errorf("send bootstrap: %w", err)))
	}
	err = s.supervise(ctx, bootCtx, start)
	if errors.Is(err, ErrHostileGuest) || errors.Is(err, muxguard.ErrStalled) {
		// No orderly stop for a guest that broke a bound (it would only
		// get more time to consume) or reads nothing: the runtime is
		// killed now.
		_ = s.inst.Kill()
		s.sess.Close()
		return s.fail(err)
	}
	if err != nil {
		if !s.guestDone {
			s.shutdown("sandbox failed")
		}
		s.sess.Close()
		s.waitExit(stopMargin)
		return s.fail(err)
	}
	return nil
}

func (s *run) handshake(ctx context.Context, conn net.Conn, helloWait time.Duration) error {
	// A VM's serial transport is connected by qemu when it starts, long
	// before the guest speaks: a session started now would end on its
	// first unanswered keepalive (15 s plus a 10 s write timeout) while a
	// slow, emulated guest is still booting. The session starts with the
	// guest's first byte, waited for until the Hello is due.
	start := time.Now()
	// A stop request ends the wait.
	raw := conn
	s.transport = raw
	stopWait := context.AfterFunc(ctx, func() { raw.Close() })
	// Coalesce sits on the transport itself, below the guard and the
	// replayed first byte: each frame goes out in one write (writev on a
	// socket), within the guard's write deadline.
	protocol.TuneTransport(conn)
	conn, err := firstByte(protocol.Coalesce(conn), helloWait)
	stopWait()
	if err != nil {
		return err
	}
	helloWait -= time.Since(start)
	mc := protocol.MuxConfig(nil)
	if s.cfg.KeepAliveInterval > 0 {
		mc.KeepAliveInterval = s.cfg.KeepAliveInterval
	}
	if s.cfg.ConnectionWriteTimeout > 0 {
		mc.ConnectionWriteTimeout = s.cfg.ConnectionWriteTimeout
	}
	s.guard = muxguard.New(conn, s.cfg.Guard)
	sess, err := yamux.Server(s.guard, mc)
	if err != nil {
		conn.Close()
		return fmt.Errorf("start session: %w", err)
	}
	s.sess = sess
	// A stop request ends a handshake in progress.
	defer context.AfterFunc(ctx, func() { sess.Close() })()
	caps := []string{protocol.CapProcess}
	if s.cfg.Egress != nil {
		caps = append(caps, protocol.CapEgress, protocol.CapDNS, protocol.CapAbort)
	}
	if s.offersClock() {
		caps = append(caps, protocol.CapClock)
	}
	if s.dataOffer = s.dataCarriers(); len(s.dataOffer) > 0 {
		if s.dataToken, err = protocol.NewDataToken(); err != nil {
			return err
		}
		caps = append(caps, s.dataOffer...)
	}
	ctl, hello, welcome, err := protocol.HostHandshake(trackedSession{sess, s.guard}, s.cfg.MinVersion, s.cfg.MaxVersion, protocol.Welcome{
		HostVersion:       buildinfo.Version,
		Capabilities:      caps,
		AllowLoopbackLink: s.cfg.Bootstrap.Sandbox != nil && s.cfg.Bootstrap.Sandbox.AllowLoopbackLink,
		DataToken:         s.dataToken,
	}, helloWait)
	if err != nil {
		return fmt.Errorf("handshake with guest: %w", err)
	}
	if s.cfg.FrameBodyTimeout > 0 {
		ctl.SetFrameBodyTimeout(s.cfg.FrameBodyTimeout)
	}
	s.ctl = ctl
	s.session = &Session{sess: sess, guard: s.guard, ctl: ctl, caps: append([]string(nil), hello.Capabilities...)}
	if msg := s.directSaid(hello); msg != "" {
		s.setState(api.StateStarting, msg)
	}
	if s.cfg.Attach != nil {
		s.cfg.Attach(s.session)
	}
	s.startDataPlane(hello)
	s.startClock(ctx, hello)
	s.emit(api.Event{
		Event: api.KindAgent, PID: max(hello.PID, 0), Protocol: welcome.Version,
		AgentVersion: guestText(hello.AgentVersion, 64), Message: "guest agent connected",
	})
	if s.cfg.Egress != nil {
		s.emit(s.cfg.Egress.PolicyEvent("egress policy in force"))
	}
	return nil
}

func (s *run) withDiag(err error) error {
	if d := s.diag.lastLines(); d != "" {
		return fmt.Errorf("%w (runtime said: %s)", err, guestText(d, maxGuestText))
	}
	return err
}

// readControl forwards control frames until the stream fails. Frames
// read before the guest closed the session (its last exit reports and
// "stopped") are still handed over; only the end of the run drops them.
func (s *run) readControl() {
	defer s.wg.Done()
	for {
		f, err := s.ctl.Recv()
		if err != nil {
			s.recvErr <- err
			return
		}
		select {
		case s.frames <- f:
		case <-s.quit:
			return
		}
	}
}

// supervise handles guest messages until a stop request or a failure.
func (s *run) supervise(ctx, bootCtx context.Context, start time.Time) error {
	ready := false
	bootDone := bootCtx.Done()
	for {
		// A stop request wins over every other outcome due at the same
		// time (select picks among ready cases at random): --timeout
		// shorter than the boot is a stop, never a boot failure.
		if ctx.Err() != nil {
			bootDone = nil
		}
		select {
		case <-ctx.Done():
			reason := stopReason(ctx)
			s.shutdown(reason)
			if err := s.guardErr(); err != nil {
				// The guest broke a bound before or while it was stopped:
				// that is what ended it.
				return err
			}
			s.setState(api.StateStopped, "stopped: "+reason)
			return nil
		case <-bootDone:
			if ctx.Err() != nil {
				continue
			}
			if !ready {
				return failure.With(failure.ErrBootTimeout, fmt.Errorf("guest not ready within %s", s.cfg.BootTimeout))
			}
			bootDone = nil
		case <-s.guard.Violated():
			return s.guardErr()
		case err := <-s.dataViolation:
			return failure.With(failure.ErrHostileGuest, err)
		case <-s.inst.Done():
			if err := s.guardErr(); err != nil {
				return err
			}
			if len(s.frames) > 0 { // what the guest said before it went comes first
				continue
			}
			s.guestDone = true
			return failure.With(failure.ErrRuntimeFailed, s.withDiag(s.inst.Err()))
		case err := <-s.recvErr:
			if gerr := s.guardErr(); gerr != nil {
				return gerr
			}
			if len(s.frames) > 0 {
				s.recvErr <- err
				continue
			}
			s.guestDone = true
			if isViolation(err) {
				return fmt.Errorf("guest broke the protocol on the control stream: %w", err)
			}
			return failure.With(failure.ErrRuntimeFailed, s.withDiag(fmt.Errorf("guest connection lost: %w", err)))
		case f := <-s.frames:
			switch f.Type {
			case protocol.TypeState:
				var st protocol.State
				if err := f.Decode(&st); err != nil {
					return fmt.Errorf("guest sent a bad State: %w", err)
				}
				if st.Process != nil {
					s.emitProcess(st.Process)
				}
				msg := guestText(st.Message, maxGuestText)
				switch st.State {
				case protocol.StateStarting:
					if msg == "" {
						msg = "applying bootstrap"
					}
					s.setState(api.StateStarting, "guest: "+msg)
				case protocol.StateReady:
					ready, bootDone = true, nil
					m := fmt.Sprintf("guest ready in %s", time.Since(start).Round(time.Millisecond))
					if msg != "" {
						m += ": " + msg
					}
					s.setReady(m, guestText(st.URL, 256), guestText(st.Username, 64))
					s.phases.mark("bootstrap to ready")
					s.cfg.Log.Debug("boot phases", "sandbox", s.cfg.Name, "phases", s.phases.String())
				case protocol.StateFailed:
					return failure.With(failure.GuestReason(st.Reason), fmt.Errorf("guest: %s", msg))
				case protocol.StateStopped:
					if ctx.Err() != nil {
						// A stop was requested: the guest's stopped may be its
						// answer, read before the request was seen. Stop wins.
						continue
					}
					s.guestDone = true
					return failure.With(failure.ErrGuestFailed, fmt.Errorf("guest stopped on its own: %s", msg))
				default:
					return failure.With(protocol.ErrBadBody, fmt.Errorf("guest sent an unknown state %q", guestText(st.State, 32)))
				}
			case protocol.TypeError:
				var e protocol.Error
				if err := f.Decode(&e); err != nil {
					return fmt.Errorf("guest sent a bad Error: %w", err)
				}
				return failure.With(guestErrorKind(e.Code), fmt.Errorf("guest error %s: %s", guestText(e.Code, 32), guestText(e.Message, maxGuestText)))
			case protocol.TypeProcess:
				var ps protocol.ProcessStatus
				if err := f.Decode(&ps); err != nil {
					return fmt.Errorf("guest sent a bad Process: %w", err)
				}
				s.emitProcess(&ps)
			case protocol.TypeAbort:
				var ab protocol.Abort
				if err := f.Decode(&ab); err != nil {
					return fmt.Errorf("guest sent a bad Abort: %w", err)
				}
				s.abortEgress(ab.Stream)
			case protocol.TypeClock:
				if err := s.clockFrame(f); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%w: guest sent %s on the control stream", protocol.ErrUnexpectedType, f.Type)
			}
		}
	}
}

// stopReason is why ctx ended: its cause, or "stop requested".
func stopReason(ctx context.Context) string {
	if c := context.Cause(ctx); c != nil && c != context.Canceled {
		return c.Error()
	}
	return "stop requested"
}

// guestErrorKind is the failure kind of an Error frame the guest sent.
func guestErrorKind(code string) error {
	switch code {
	case protocol.CodeBootstrap:
		return failure.ErrGuestBootstrap
	case protocol.CodeVersionMismatch:
		return protocol.ErrVersionMismatch
	}
	return failure.ErrGuestFailed
}

// isTimeout reports whether a handshake failed because time ran out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, protocol.ErrHandshakeTimeout) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// isViolation reports whether a control-stream read failed because the
// guest sent something no correct guest sends (as opposed to the stream
// or the connection ending).
func isViolation(err error) bool {
	for _, e := range []error{protocol.ErrFrameTooLarge, protocol.ErrUnknownType, protocol.ErrBadFlags, protocol.ErrTruncated} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// setReady emits ready with the daemon's URL and username.
func (s *run) setReady(msg, url, username string) {
	s.mu.Lock()
	if s.state != api.StateStarting {
		s.mu.Unlock()
		return
	}
	s.state = api.StateReady
	s.mu.Unlock()
	e := api.Event{Event: api.KindState, State: api.StateReady, Message: msg, URL: url, Username: username}
	if s.cfg.MapURL != nil && url != "" {
		if host := s.cfg.MapURL(url); host != "" {
			e.URL, e.GuestURL = host, url
		}
	}
	s.emit(e)
	crashpoint.Hit(crashpoint.BootReady)
}

func (s *run) emitProcess(p *protocol.ProcessStatus) {
	if !s.processEv.allow() {
		return
	}
	running := p.Running
	e := api.Event{
		Event: api.KindProcess, Process: orUnnamed(guestText(p.Name, 64)), PID: max(p.PID, 0), Running: &running,
		ExitCode: p.ExitCode, Signal: guestText(p.Signal, 32),
		Restarts: max(p.Restarts, 0), RestartInMS: max(p.RestartInMS, 0),
	}
	switch {
	case running:
		e.Message = "started"
	case p.RestartInMS > 0:
		e.Message = fmt.Sprintf("restarting in %s", time.Duration(p.RestartInMS)*time.Millisecond)
	default:
		e.Message = "exited"
	}
	s.emit(e)
}

// shutdown asks the guest to stop within its grace, waits for it to say
// stopped (or vanish), then kills the runtime.
func (s *run) shutdown(reason string) {
	if s.ctl == nil {
		_ = s.inst.Kill()
		return
	}
	grace := s.cfg.Bootstrap.Grace()
	// One deadline for the whole stop, the Shutdown's write included.
	deadline := time.After(grace + stopMargin)
	if err := s.ctl.SendWithin(protocol.TypeShutdown, protocol.Shutdown{Reason: reason, GraceMS: grace.Milliseconds()}, min(shutdownSendTimeout, grace+stopMargin)); err != nil {
		_ = s.inst.Kill()
		return
	}
	for {
		select {
		case f := <-s.frames:
			var st protocol.State
			var ps protocol.ProcessStatus
			if f.Type == protocol.TypeProcess && f.Decode(&ps) == nil {
				s.emitProcess(&ps)
			}
			if f.Type == protocol.TypeError {
				// The guest gave up (it refused the bootstrap or failed to
				// start): it reads nothing more and lingers until we close.
				s.sess.Close()
				s.waitExitBy(deadline)
				return
			}
			if f.Type == protocol.TypeState && f.Decode(&st) == nil {
				if st.Process != nil {
					s.emitProcess(st.Process)
				}
				if st.State == protocol.StateStopped {
					// The guest lingers until we close the session.
					s.sess.Close()
					s.waitExitBy(deadline)
					return
				}
			}
		case <-s.recvErr:
			s.waitExitBy(deadline)
			return
		case <-s.inst.Done():
			// Frames the guest sent before it exited (its last exit
			// reports) may still be queued: take them until the stream
			// ends, for at most a second.
			s.drainFrames(time.Second)
			return
		case <-s.guard.Violated():
			_ = s.inst.Kill()
			return
		case <-deadline:
			s.cfg.Log.Warn("guest did not stop in time, killing", "sandbox", s.cfg.Name, "grace", grace)
			_ = s.inst.Kill()
			return
		}
	}
}

// drainFrames emits the process events still queued on the control
// stream, until it ends or d passes.
func (s *run) drainFrames(d time.Duration) {
	timeout := time.After(d)
	for {
		select {
		case f := <-s.frames:
			var ps protocol.ProcessStatus
			if f.Type == protocol.TypeProcess && f.Decode(&ps) == nil {
				s.emitProcess(&ps)
			}
		case <-s.recvErr:
			return
		case <-timeout:
			return
		}
	}
}

// waitExit gives the runtime d to exit on its own (PID 1 exiting ends it),
// then kills it.
func (s *run) waitExit(d time.Duration) {
	s.waitExitBy(time.After(d))
}

// waitExitBy is waitExit with a deadline already running.
func (s *run) waitExitBy(deadline <-chan time.Time) {
	select {
	case <-s.inst.Done():
	case <-deadline:
		_ = s.inst.Kill()
	}
}

// acceptStreams serves streams the guest opens: log streams, egress
// streams when a broker is configured; other kinds are refused until their
// features exist. At most protocol.MaxStreams streams may be reading their
// header or carrying non-egress traffic at once; an egress stream leaves
// that budget once its header is read and counts against the broker's own
// limit, which answers ResourceExhausted instead of closing.
func (s *run) acceptStreams() {
	defer s.wg.Done()
	sem := make(chan struct{}, protocol.MaxStreams)
	for {
		yst, err := s.sess.AcceptStream()
		if err != nil {
			return
		}
		// The guard bounds the streams open in the session; this bounds
		// the handlers.
		st := s.guard.Track(yst)
		select {
		case sem <- struct{}{}:
		default:
			s.warn.Warn("too many guest streams, refusing", "sandbox", s.cfg.Name, "limit", protocol.MaxStreams)
			st.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			release := sync.OnceFunc(func() { <-sem })
			s.serveStream(st, release)
			st.Close()
			release()
			drain(st)
		}()
	}
}

// abortEgress ends the egress connection of stream id at once (Abort).
func (s *run) abortEgress(id uint32) {
	s.mu.Lock()
	cancel := s.aborts[id]
	s.mu.Unlock()
	if cancel != nil {
		cancel(egress.ErrGuestAborted)
	}
}

// drainFor bounds how long drain reads a stream the host is done with:
// yamux's StreamCloseTimeout, after which yamux resets it.
const drainFor = 30 * time.Second

// drain reads and drops what the guest still sends on a stream the host
// is done with, until the guest closes its side (a correct guest does at
// once) or drainFor passes: yamux would otherwise keep it in the stream's
// receive buffer, held against the session's receive budget, until the
// reset.
func drain(st net.Conn) {
	_ = st.SetReadDeadline(time.Now().Add(drainFor))
	_, _ = io.Copy(io.Discard, st)
}

func (s *run) serveStream(st net.Conn, release func()) {
	h, err := protocol.ReadStreamHeader(st, s.cfg.StreamHeaderTimeout)
	if err != nil && h.Kind != protocol.KindEgress && h.Kind != protocol.KindDNS {
		s.warn.Warn("bad guest stream", "sandbox", s.cfg.Name, "err", err)
		return
	}
	switch h.Kind {
	case protocol.KindLog:
		_ = readLines(st, func(line string) {
			if s.logs.take(len(line) + 1) {
				s.emit(api.Event{Event: api.KindLog, Stream: h.Name, Line: safetext.Line(line)})
			}
		})
	case protocol.KindEgress:
		if s.cfg.Egress == nil {
			_ = protocol.WriteEgressReply(st, protocol.EgressReply{Code: protocol.EgressUnsupportedNetwork,
				Reason: "this sandbox was started without an egress broker"})
			return
		}
		release()
		ctx, cancel := context.WithCancelCause(s.egressCtx)
		defer cancel(nil)
		if id, ok := st.(interface{ StreamID() uint32 }); ok {
			s.mu.Lock()
			s.aborts[id.StreamID()] = cancel
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				delete(s.aborts, id.StreamID())
				s.mu.Unlock()
			}()
		}
		// Serve re-validates the header and answers InvalidArgument.
		s.cfg.Egress.Serve(ctx, st, h, s.emitEgress)
	case protocol.KindDNS:
		if s.cfg.Egress == nil {
			_ = protocol.WriteDNSReply(st, protocol.DNSReply{Code: protocol.EgressUnsupportedNetwork,
				Reason: "this sandbox was started without an egress broker"})
			return
		}
		release()
		// ServeDNS re-validates the header and answers InvalidArgument.
		s.cfg.Egress.ServeDNS(s.egressCtx, st, h, s.emitEgress)
	default:
		s.warn.Warn("guest opened a stream of a kind this host does not serve", "sandbox", s.cfg.Name, "kind", h.Kind)
	}
}

// orUnnamed names what the guest left unnamed: the event schema requires
// a process's and a log stream's name.
func orUnnamed(s string) string {
	if s == "" {
		return "unnamed"
	}
	return s
}

// guestText makes a guest-supplied string safe to put in an event: valid
// UTF-8, no control characters (C0, DEL, C1: no terminal escape
// survives), at most n bytes.
func guestText(s string, n int) string { return safetext.Clean(s, n, ' ') }

// trackedSession hands out the guest's streams through the guard's read
// accounting (the handshake's control stream).
type trackedSession struct {
	*yamux.Session
	guard *muxguard.Conn
}

func (t trackedSession) Accept() (net.Conn, error) {
	st, err := t.AcceptStream()
	if err != nil {
		return nil, err
	}
	return t.guard.Track(st), nil
}

// firstByte waits up to d for the first byte from conn and returns a
// connection that reads it first. A connection without read deadlines is
// returned as it is.
func firstByte(conn net.Conn, d time.Duration) (net.Conn, error) {
	if err := conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return conn, nil
	}
	b := make([]byte, 1)
	n, err := conn.Read(b)
	_ = conn.SetReadDeadline(time.Time{})
	if n == 0 {
		conn.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("guest sent no control stream within %s", d)
		}
		return nil, fmt.Errorf("guest connection: %w", err)
	}
	return &replayConn{Conn: conn, first: b[:n]}, nil
}

// replayConn reads first before the rest of Conn.
type replayConn struct {
	net.Conn
	first []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// takeBootstrap returns the bootstrap this run sends: b checked, with a
// password of its own when b has credentials without one (handed to
// Config.PasswordFile and PasswordOut). The caller's struct is never
// changed.
func (s *run) takeBootstrap(b *bootstrap.Bootstrap) (*bootstrap.Bootstrap, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("invalid bootstrap: %w", err)
	}
	c := b.Credentials
	if c == nil {
		return b, nil
	}
	cc := *c
	if cc.Password == "" {
		p, err := GeneratePassword()
		if err != nil {
			return nil, err
		}
		cc.Password = p
	}
	bb := *b
	bb.Credentials = &cc
	if s.cfg.PasswordFile != "" {
		if err := writeSecret(s.cfg.PasswordFile, cc.Password); err != nil {
			return nil, failure.With(failure.ErrInvalidConfig, err)
		}
	}
	if s.cfg.PasswordOut != nil {
		if err := s.cfg.PasswordOut(cc.Password); err != nil {
			return nil, failure.With(failure.ErrInvalidConfig, fmt.Errorf("password output: %w", err))
		}
	}
	return &bb, nil
}
