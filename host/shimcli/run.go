package shimcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/forward"
	"github.com/oac/sandbox-agent/host/journal"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/internal/crashpoint"
	"github.com/oac/sandbox-agent/internal/systemd"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// runFlags are the flags of oac-shim run.
type runFlags struct {
	prov, name, rootfs, bootFile, eventsFile, agentPath string
	timeout, bootTimeout                                time.Duration
	tenant, environment, allocation                     string
	allowLoopback, debug                                bool
	sandboxIO, passwordFile, policyFile                 string
	installs, volumes                                   installFlag
	providers                                           map[string]func() provider.Provider
	allow, upstreams, forwards                          stringList
	maxStreams, forwardMaxStreams                       int
	connectTimeout, idleTimeout                         time.Duration
	control, controlSocket                              string
	bootFormat                                          string
	passwordFD                                          int
	dataPlane                                           string
	clockInterval                                       time.Duration
	// keepRoot is where kept sandboxes live: start runs one from there,
	// run refuses a name one of them has.
	keepRoot string
	// announced is this shim's entry among the keep root's running
	// sandboxes (list.go), held until runShim returns.
	announced *kept.Announcement
	// outlive: --outlive-parent (outlive.go); journal is its events
	// journal in the announced entry.
	outlive bool
	journal *journal.Writer
}

// parseRunFlags parses the flags of cmd: "run", or "start", which takes
// the create flags (provider, rootfs, installs, volumes, the provider's
// own) from the kept sandbox's record and refuses them here.
func parseRunFlags(cmd string, args []string, stderr io.Writer) (*runFlags, int) {
	f := &runFlags{installs: installFlag{}, volumes: installFlag{}}
	fs := flag.NewFlagSet("oac-shim "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		if cmd == "run" {
			fmt.Fprintln(stderr, "oac-shim run: a throwaway sandbox, created, started and destroyed when the shim exits\n(oac-shim create and start keep one across runs: docs/kept.md). Flags:")
		} else {
			fmt.Fprintln(stderr, "oac-shim start: runs the kept sandbox NAME (oac-shim create) until it stops, as run does;\nwhat it writes in /home, /environment and /usr/local outlives the run. Flags:")
		}
		fs.PrintDefaults()
	}
	fs.StringVar(&f.prov, "provider", "bwrap", "provider: "+strings.Join(provider.Names(), ", "))
	fs.StringVar(&f.name, "name", "", "sandbox name (a-z, 0-9, '-'; required)")
	fs.StringVar(&f.rootfs, "rootfs", "", "rootfs directory (default: read-only view of the host's /usr, /bin, /lib*, /etc essentials)")
	fs.StringVar(&f.bootFile, "bootstrap", "", `bootstrap JSON: a file, "-" for stdin (before the commands with --control stdin) or "fd:N" for an inherited descriptor (default: no daemon)`)
	fs.StringVar(&f.bootFormat, "bootstrap-format", formatOAC, `"oac" (the bootstrap) or "core" (Core's sandbox.Bootstrap: runtime and sandbox_io)`)
	passwordFD := fs.String("password-fd", "", "write each attempt's daemon password as a line \"ATTEMPT PASSWORD\" to this inherited descriptor (3 or more)")
	fs.StringVar(&f.eventsFile, "events", "", "write events to this file instead of stdout")
	fs.DurationVar(&f.timeout, "timeout", 0, "stop the sandbox in order after this long (0: run until SIGINT/SIGTERM)")
	fs.DurationVar(&f.bootTimeout, "boot-timeout", sandbox.DefaultBootTimeout, "fail if the guest is not ready within this long")
	fs.StringVar(&f.agentPath, "agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	fs.StringVar(&f.tenant, "tenant", "", "this sandbox's tenant id (a hosted sandbox: the sandbox_io resource must name it)")
	fs.StringVar(&f.environment, "environment", "", "this sandbox's environment id")
	fs.StringVar(&f.allocation, "allocation", "", "this sandbox's allocation id")
	fs.BoolVar(&f.allowLoopback, "allow-loopback-link", false, "accept a ws:// or wss:// link URL on a loopback host (development only)")
	fs.StringVar(&f.sandboxIO, "sandbox-io", "", "host binary to install as /usr/local/bin/oac-sandbox-io in the guest")
	fs.Var(f.installs, "install", "NAME=PATH: install a host binary as /usr/local/bin/NAME in the guest (repeatable)")
	fs.Var(f.volumes, "volume", "GUESTDIR=HOSTDIR: bind a host directory as the guest's /home or /environment (a persistent volume; default a fresh tmpfs)")
	fs.StringVar(&f.passwordFile, "password-file", "", "write the daemon's password (generated per attempt when the bootstrap has none) to this new file, mode 0600; a later attempt (reset, restart) replaces it whole")
	fs.BoolVar(&f.debug, "debug", false, "log debug messages")
	f.providers = provider.Declare(fs)
	fs.Var(&f.allow, "allow", "egress rule HOST:PORT, *.SUFFIX:PORT or CIDR:PORT (ports LO-HI allowed); repeatable")
	fs.Var(&f.upstreams, "upstream", "named egress upstream NAME:PORT=ADDR (e.g. llm-gateway:443=127.0.0.1:8443); repeatable")
	fs.StringVar(&f.policyFile, "policy", "", "egress policy JSON file, re-read on SIGHUP (rules and upstreams add to --allow and --upstream)")
	fs.IntVar(&f.maxStreams, "egress-max-streams", egress.DefaultMaxStreams, "concurrent egress connections; the next one is refused with ResourceExhausted")
	fs.DurationVar(&f.connectTimeout, "egress-connect-timeout", egress.DefaultConnectTimeout, "bound on resolving and connecting one egress target")
	fs.DurationVar(&f.idleTimeout, "egress-idle-timeout", egress.DefaultIdleTimeout, "close an egress connection no byte crossed for this long")
	fs.Var(&f.forwards, "forward", "LISTEN=GUESTPORT: listen on host loopback (127.0.0.1:PORT, [::1]:PORT) or a unix socket path and carry each connection to 127.0.0.1:GUESTPORT in the guest; repeatable")
	fs.StringVar(&f.dataPlane, "data-plane", "auto", `how egress and forward connections travel: "auto" (each on a kernel stream of its own beside the session where the transport allows, and direct mode, the workload's connects answered with the host's own sealed sockets with no relay, wherever every guarantee of it holds; see docs/egress.md), "direct" (the same as auto), "off" (as streams of the session), "fd" or "dial" (that carrier only, without direct mode)`)
	fs.DurationVar(&f.clockInterval, "clock-interval", sandbox.DefaultClockInterval, "how often the host reads a VM guest's clock and steps it when it is off by more than 100ms (0: never; other guests share the host's clock)")
	fs.IntVar(&f.forwardMaxStreams, "forward-max-streams", forward.DefaultMaxStreams, "concurrent forwarded connections, all forwards together; the next one is closed")
	fs.StringVar(&f.control, "control", "", `"stdin": read control commands as JSON lines on stdin (answers go to the events output; end of input stops the sandbox, unless --outlive-parent)`)
	fs.StringVar(&f.controlSocket, "control-socket", "", "serve control commands as JSON lines on this unix socket (mode 0600)")
	fs.BoolVar(&f.outlive, "outlive-parent", false, "keep the sandbox when the parent goes: the end of stdin ends only --control stdin, events are also kept (the newest 4 MiB) for oac-shim attach NAME, and a control socket is served in the keep root's running/sandboxes/NAME/ unless --control-socket names one; stop it with oac-shim stop NAME, its control socket or SIGTERM")
	if cmd == "start" {
		fs.StringVar(&f.keepRoot, "keep-root", "", "where kept sandboxes live (default "+persist.DefaultRoot()+")")
	} else {
		fs.StringVar(&f.keepRoot, "keep-root", "", "where kept sandboxes live (default "+persist.DefaultRoot()+"); run refuses the name of one of them")
	}
	if err := fs.Parse(args); err != nil {
		return nil, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "oac-shim %s: unexpected arguments %q\n", cmd, fs.Args())
		return nil, 2
	}
	if cmd == "start" {
		if fixed := createFlagsGiven(fs); len(fixed) > 0 {
			fmt.Fprintf(stderr, "oac-shim start: %s was fixed at create (oac-shim destroy and create the sandbox to change it)\n", strings.Join(fixed, ", "))
			return nil, 2
		}
	}
	if _, ok := f.providers[f.prov]; !ok {
		fmt.Fprintf(stderr, "oac-shim "+cmd+": unknown provider %q (have %s)\n", f.prov, strings.Join(provider.Names(), ", "))
		return nil, 2
	}
	if f.name == "" {
		fmt.Fprintln(stderr, "oac-shim "+cmd+": --name is required")
		return nil, 2
	}
	if _, _, err := bootstrapSource(f.bootFile); err != nil {
		fmt.Fprintf(stderr, "oac-shim "+cmd+": --bootstrap: %v\n", err)
		return nil, 2
	}
	if f.bootFormat != formatOAC && f.bootFormat != formatCore {
		fmt.Fprintf(stderr, "oac-shim "+cmd+": --bootstrap-format takes %q or %q\n", formatOAC, formatCore)
		return nil, 2
	}
	if *passwordFD != "" {
		n, err := parseFD(*passwordFD)
		if err != nil {
			fmt.Fprintf(stderr, "oac-shim "+cmd+": --password-fd: %v\n", err)
			return nil, 2
		}
		f.passwordFD = n
	}
	if f.control != "" && f.control != "stdin" {
		fmt.Fprintln(stderr, `oac-shim run: --control takes "stdin" (use --control-socket PATH for a socket)`)
		return nil, 2
	}
	switch f.dataPlane {
	case "auto", sandbox.DataPlaneOff, "fd", "dial", "direct":
	default:
		fmt.Fprintln(stderr, `oac-shim run: --data-plane takes "auto", "off", "fd", "dial" or "direct"`)
		return nil, 2
	}
	if f.clockInterval != 0 && f.clockInterval < minClockInterval {
		fmt.Fprintf(stderr, "oac-shim "+cmd+": --clock-interval must be 0 (off) or at least %s\n", minClockInterval)
		return nil, 2
	}
	if f.forwardMaxStreams < 1 {
		fmt.Fprintln(stderr, "oac-shim "+cmd+": --forward-max-streams must be at least 1")
		return nil, 2
	}
	// Host paths are resolved here, once (the providers' own path flags
	// as they are parsed): runtimes run in other working directories (qemu
	// and the OCI runtimes in /), where a relative path would name
	// something else or nothing.
	for _, p := range []*string{&f.rootfs, &f.agentPath, &f.sandboxIO} {
		*p = provider.AbsPath(*p)
	}
	for _, m := range []installFlag{f.installs, f.volumes} {
		for k, v := range m {
			m[k] = provider.AbsPath(v)
		}
	}
	return f, 0
}

// newLogger logs to the journal when stderr is the journal, else as text
// to stderr.
func newLogger(stderr io.Writer, debug bool) *slog.Logger {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	var h slog.Handler
	if stderr == os.Stderr {
		h = systemd.JournalHandler("oac-shim", level)
	}
	if h == nil {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	return slog.New(h).With("component", "oac-shim")
}

func runCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f, code := parseRunFlags("run", args, stderr)
	if f == nil {
		return code
	}
	return runShim(f, nil, stdin, stdout, stderr)
}

// runShim runs one sandbox until it stops: a throwaway one (lease nil,
// oac-shim run) or a kept one (oac-shim start).
func runShim(f *runFlags, lease *kept.Lease, stdin io.Reader, stdout, stderr io.Writer) int {
	// Last: once the entry is gone, oac-shim stop takes the sandbox for stopped.
	defer func() { f.announced.Close() }()
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(sandbox.SoftMemoryLimit)
	}
	log := newLogger(stderr, f.debug)
	// Every failure exits with its code's status (api.Failures).
	fail := func(err error) int {
		fmt.Fprintf(stderr, "oac-shim: %v\n", err)
		return failure.Exit(err)
	}
	out := stdout
	if f.outlive && f.eventsFile == "" {
		po := newParentOut(stdout)
		defer po.Close()
		out = po
	}
	if f.eventsFile != "" {
		ef, err := os.OpenFile(f.eventsFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			return fail(failure.With(failure.ErrInvalidConfig, fmt.Errorf("open events file: %w", err)))
		}
		defer ef.Close()
		out = ef
	}
	sink := api.NewJSONLines(out)
	// Input errors are reported like every other failure: one failed
	// event (the last event is always failed or stopped) and a reason.
	failedEvent := func(err error) int {
		sink.Emit(api.Event{Time: time.Now().UTC(), Sandbox: f.name, Event: api.KindState, State: api.StateFailed,
			Message: err.Error(), Code: failure.Code(err)})
		return fail(err)
	}
	inputFail := func(err error) int {
		return failedEvent(fmt.Errorf("invalid bootstrap, nothing created: %w", err))
	}
	boot, stdin, err := loadBootstrap(f, stdin)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "oac-shim run: %s\n", string(ue))
			return 2
		}
		return inputFail(err)
	}
	pol, err := egress.LoadPolicy(f.policyFile, f.allow, f.upstreams)
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim run: %v\n", err)
		return 2
	}
	if f.maxStreams < 1 || f.connectTimeout <= 0 || f.idleTimeout <= 0 {
		fmt.Fprintln(stderr, "oac-shim run: --egress-max-streams must be at least 1 and the egress timeouts positive")
		return 2
	}
	if lease == nil {
		// A throwaway sandbox holds its name in the keep root while it
		// runs: the provider's objects of that name (a container, a
		// registered distro) are a kept sandbox's when one has it.
		res, err := keptService(f.keepRoot, stderr).Reserve(context.Background(), f.name)
		if err != nil {
			return failedEvent(err)
		}
		defer res.Close()
	}
	var specs []forward.Spec
	for _, v := range f.forwards {
		sp, err := forward.ParseSpec(v)
		if err != nil {
			fmt.Fprintf(stderr, "oac-shim run: --forward: %v\n", err)
			return 2
		}
		specs = append(specs, sp)
	}
	broker := egress.New(egress.Config{
		Policy: pol, MaxStreams: f.maxStreams, ConnectTimeout: f.connectTimeout, IdleTimeout: f.idleTimeout,
		Log: log.With("part", "egress"),
	})
	if f.agentPath == "" {
		p, err := defaultAgentPath()
		if err != nil {
			return failedEvent(failure.With(failure.ErrInvalidConfig, err))
		}
		f.agentPath = p
	}
	_, verdict := osVerdict()
	switch verdict.Level {
	case ospolicy.Block:
		return failedEvent(failure.With(failure.ErrOSUnsupported, errors.New(verdict.Message)))
	case ospolicy.Warn:
		log.Warn(verdict.Message)
	}
	prov := f.providers[f.prov]()
	for _, msg := range prov.Capabilities().Warnings {
		log.Warn(msg)
	}
	if f.outlive {
		if err := startOutliving(f, sink, log); err != nil {
			return failedEvent(err)
		}
		defer endOutliving(f, sink)
	}
	s := newShim(f, sink, log, broker)
	defer s.fwd.Close()
	s.kept = lease
	if f.passwordFD != 0 {
		pw, err := openFD(f.passwordFD, "--password-fd")
		if err != nil {
			return failedEvent(failure.With(failure.ErrInvalidConfig, fmt.Errorf("nothing created: %w", err)))
		}
		defer pw.Close()
		s.passwordOut = pw
	}
	for _, sp := range specs {
		if _, err := s.fwd.Add(sp); err != nil {
			return failedEvent(failure.With(failure.ErrInvalidConfig, fmt.Errorf("nothing created: %w", err)))
		}
	}
	s.base = sandbox.Config{
		Name:        f.name,
		Provider:    prov,
		AgentPath:   f.agentPath,
		Rootfs:      f.rootfs,
		Bootstrap:   boot,
		Log:         log,
		Diag:        stderr,
		BootTimeout: f.bootTimeout,
		Egress:      broker,

		SandboxIOPath: f.sandboxIO,
		Install:       f.installs,
		Volumes:       f.volumes,
		DataPlane:     dataPlaneSetting(f.dataPlane),
		ClockInterval: clockSetting(f.clockInterval),
	}
	if lease != nil {
		s.base.Keep = &provider.Keep{Dir: lease.Dir}
		for _, msg := range lease.Notes {
			s.emit(api.Event{Event: api.KindKept, Message: msg})
		}
		if err := lease.Started(); err != nil {
			return failedEvent(err)
		}
	}
	err = s.run(stdin)
	crashpoint.Hit(crashpoint.StopInstanceEnded)
	if lease != nil {
		lease.Ended(err)
	}
	if err != nil {
		if errors.Is(err, provider.ErrUnavailable) {
			fmt.Fprintln(stderr, "oac-shim: run 'oac-shim check' to see what this host is missing")
		}
		return fail(err)
	}
	return 0
}

// usageError is a mistake in the command line (exit status 2).
type usageError string

func (e usageError) Error() string { return string(e) }

// loadBootstrap reads --bootstrap and applies the identity flags; it
// returns what remains of stdin for the control API.
func loadBootstrap(f *runFlags, stdin io.Reader) (*bootstrap.Bootstrap, io.Reader, error) {
	boot, rest, err := readAndDecode(f, stdin)
	if err != nil {
		return nil, rest, err
	}
	boot, err = withIdentity(f, boot)
	return boot, rest, err
}

func readAndDecode(f *runFlags, stdin io.Reader) (*bootstrap.Bootstrap, io.Reader, error) {
	if f.bootFile == "" {
		return nil, stdin, nil
	}
	data, rest, err := readBootstrap(f, stdin)
	if err == nil {
		var boot *bootstrap.Bootstrap
		if boot, err = decodeBootstrap(f.bootFormat, data); err == nil {
			return boot, rest, nil
		}
	}
	what := f.bootFile
	if what == "-" {
		what = "stdin"
	}
	return nil, rest, fmt.Errorf("read %s: %w", what, err)
}

// withIdentity applies --tenant, --environment and --allocation.
func withIdentity(f *runFlags, boot *bootstrap.Bootstrap) (*bootstrap.Bootstrap, error) {
	if f.tenant != "" || f.environment != "" || f.allocation != "" || f.allowLoopback {
		if f.tenant == "" || f.environment == "" || f.allocation == "" {
			return nil, usageError("--tenant, --environment and --allocation go together")
		}
		if boot == nil {
			boot = &bootstrap.Bootstrap{Version: bootstrap.Version}
		}
		id := &bootstrap.Identity{TenantID: f.tenant, EnvironmentID: f.environment, AllocationID: f.allocation, AllowLoopbackLink: f.allowLoopback}
		if b := boot.Sandbox; b != nil {
			if b.TenantID != id.TenantID || b.EnvironmentID != id.EnvironmentID || b.AllocationID != id.AllocationID {
				return nil, bootstrap.ErrIdentityMismatch
			}
		}
		boot.Sandbox = id
	}
	return boot, nil
}

// signals delivers SIGINT and SIGTERM as stop reasons, and SIGHUP to the
// policy reload, until ctx ends.
func (s *shim) watchSignals(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	go func() {
		defer signal.Stop(sigs)
		defer signal.Stop(hups)
		go reloadOnHUP(ctx, hups, s.name, s.f.policyFile, s.f.allow, s.f.upstreams, s.broker, s.sink, s.log)
		for {
			select {
			case sig := <-sigs:
				s.requestStop(fmt.Errorf("received %s", sig))
			case <-ctx.Done():
				return
			}
		}
	}()
}

// state, for the systemd status line.
func statusLine(st api.Status) string {
	line := string(st.State)
	if st.URL != "" {
		line += " " + st.URL
	}
	if st.Message != "" {
		line += ": " + st.Message
	}
	return line
}

// dataPlaneSetting maps --data-plane to sandbox.Config.DataPlane.
func dataPlaneSetting(v string) string {
	switch v {
	case "fd":
		return protocol.CapDataFD
	case "dial":
		return protocol.CapDataDial
	case "off":
		return sandbox.DataPlaneOff
	case "direct":
		return sandbox.DataPlaneDirect
	}
	return ""
}

// minClockInterval bounds --clock-interval from below: each check is a
// message each way on the control stream.
const minClockInterval = 100 * time.Millisecond

// clockSetting maps --clock-interval (0: off) to
// sandbox.Config.ClockInterval (negative: off).
func clockSetting(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
