package guestcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/guest/agent"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/netns"
	"github.com/oac/sandbox-agent/guest/reaper"
	"github.com/oac/sandbox-agent/guest/vminit"
	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/helper"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/internal/systemd"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// Main runs oac-guest with args (without the program name) and returns its
// exit code. With workload.LaunchArg first it is the workload launcher
// the agent starts for each workload process (it returns only if that
// process could not be started).
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == workload.LaunchArg {
		return workload.Main()
	}
	env := cli.Env{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr}
	if len(args) > 0 && (args[0] == "version" || args[0] == "--version" || args[0] == "-version") {
		return versionCmd(args[1:], env)
	}
	if len(args) > 0 && args[0] == BridgeArg {
		return bridge(args[1:], os.Stdin, os.Stdout, env)
	}
	if len(args) > 0 && args[0] == HelperArg {
		return runHelper(args, env)
	}
	if len(args) > 0 && args[0] == SeedKeptArg {
		fs := cli.FlagSet("oac-guest seed-kept")
		env.Usage = func(w io.Writer, _ *flag.FlagSet) {
			fmt.Fprintln(w, "usage: oac-guest seed-kept DIR\n\nPrepares a kept sandbox's volume DIR from the image, before the agent starts\n(a Pod's init container).")
		}
		pos, code, ok := cli.Parse(fs, args[1:], env)
		if !ok {
			return code
		}
		if len(pos) != 1 {
			return cli.Usagef(fs, stderr, "want one DIR, a kept sandbox's volume (see oac-guest seed-kept --help)")
		}
		if err := vminit.SeedKept(pos[0]); err != nil {
			fmt.Fprintln(stderr, "oac-guest:", err)
			return 1
		}
		return 0
	}
	fs := cli.FlagSet("oac-guest")
	env.Usage = guestUsage
	transportURL := fs.String("transport", "", "endpoint URL of the host (unix:///PATH, vsock://CID:PORT, stdio://, serial:///DEV); default: detect")
	showVersion := fs.Bool("version", false, "print the version and exit")
	debug := fs.Bool("debug", false, "log debug messages")
	offline := fs.Bool("offline", false, "the host reaches this guest over its transport alone: delete every network interface but lo before anything starts (a Kubernetes Pod)")
	kept := fs.Bool("kept", false, "a kept sandbox's container: give /usr/local (but bin and sbin) to uid 1000, whose installs outlive the run")
	pos, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(fs, stderr, "unexpected arguments %q (oac-guest --help says what it takes)", pos)
	}
	if *showVersion {
		cli.PrintVersion(stdout, "oac-guest", false)
		return 0
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := newLogger(level, stderr)

	pid1 := os.Getpid() == 1
	if pid1 {
		mounts := initsys.Mounts
		if *transportURL != "" { // a container's PID 1 (a VM's finds its transport)
			mounts = initsys.ContainerMounts
		}
		res, err := initsys.EnsureMounts(mounts)
		for _, r := range res {
			if r.Err != nil {
				// Only optional mounts fail here (a required one returns err):
				// inside a user namespace the kernel refuses sysfs, for one.
				log.Info("optional mount unavailable", "target", r.Target, "err", r.Err)
			} else {
				log.Debug("mount", "target", r.Target, "action", r.Action)
			}
		}
		if err != nil {
			log.Error("init failed", "err", err)
			return 1
		}
		if _, err := initsys.LoopbackUp(); err != nil {
			log.Warn("loopback", "err", err)
		}
	} else if err := reaper.BecomeSubreaper(); err != nil {
		log.Warn("not PID 1 and cannot become a subreaper: orphans will not be reaped here", "err", err)
	}
	if *offline && !dropInterfaces {
		log.Warn("offline: network interfaces kept: this oac-guest was built with oac_keep_interfaces, for tests only")
	} else if *offline {
		// Before the agent looks at its interfaces: the workload (and the
		// agent) then have only lo, as in a container without a network.
		dropped, err := netns.DropOthers()
		if err != nil {
			log.Warn("offline: interfaces left (the workload gets a namespace of its own, or none)", "err", err)
		} else if len(dropped) > 0 {
			log.Info("offline: network interfaces deleted", "interfaces", dropped)
		}
	}
	if *kept {
		if err := vminit.HandLocalTo1000(""); err != nil {
			log.Warn("kept sandbox", "err", err)
		}
	}
	rp := reaper.New()
	// A host that goes away closes the stdio transport: writing to it must
	// fail with EPIPE (and stop the guest in order), not kill the agent
	// with SIGPIPE. Notify, not Ignore: an ignored signal would stay
	// ignored in every process the agent starts.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if pid1 && *transportURL == "" {
		// PID 1 of an oac VM: settings come from the kernel command line
		// and Boot never returns (it powers the VM off instead).
		params, err := vminit.ReadParams()
		switch {
		case err == nil:
			if params.Debug {
				log = newLogger(slog.LevelDebug, stderr)
			}
			vminit.Boot(ctx, params, agent.Config{AgentVersion: buildinfo.Version, Reaper: rp, Log: log, SetHostname: true})
		case !errors.Is(err, vminit.ErrNotVM):
			vminit.Fatal(log, err)
		}
	}

	var ep transport.Endpoint
	var err error
	if *transportURL != "" {
		ep, err = transport.Parse(*transportURL)
	} else {
		ep, err = agent.DetectEndpoint()
	}
	if err != nil {
		log.Error("transport", "err", err)
		return 2
	}
	// Under systemd (NOTIFY_SOCKET): READY=1 once the sandbox is ready,
	// STATUS= with each state, STOPPING=1 when it stops, and the watchdog.
	notify := systemd.NewNotifier(log)
	wctx, stopWatchdog := context.WithCancel(ctx)
	defer stopWatchdog()
	go notify.Watchdog(wctx, nil)
	err = agent.Run(ctx, agent.Config{
		Endpoint:     ep,
		AgentVersion: buildinfo.Version,
		Reaper:       rp,
		Log:          log,
		SetHostname:  pid1,
		OnState:      func(st protocol.State) { notifyState(notify, st) },
	})
	notify.Stopping("stopped")
	if err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// notifyState tells systemd about a state the agent reports to the host.
func notifyState(n *systemd.Notifier, st protocol.State) {
	line := st.State
	if st.Message != "" {
		line += ": " + st.Message
	}
	switch st.State {
	case protocol.StateReady:
		n.Ready(line)
	case protocol.StateStopped:
		n.Stopping(line)
	default:
		n.Status(line)
	}
}

func newLogger(level slog.Level, stderr io.Writer) *slog.Logger {
	var h slog.Handler
	if os.Getpid() != 1 {
		// A service in a systemd guest (a WSL distro with systemd): log to
		// the journal with priorities when stderr is the journal.
		h = systemd.JournalHandler("oac-guest", level)
	}
	if h == nil {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	return slog.New(h).With("component", "oac-guest")
}

// SeedKeptArg prepares a kept sandbox's volume from the image (a Pod's
// init container; see vminit.SeedKept).
const SeedKeptArg = "seed-kept"

// BridgeArg runs oac-guest as the bridge a host execs into a Pod: it
// relays its stdin and stdout to the agent's unix+listen socket.
const BridgeArg = "bridge"

// bridgeWait bounds the bridge's wait for the agent's socket.
const bridgeWait = 30 * time.Second

// bridge connects to the agent's socket (unix:///PATH) and relays in and
// out to it until either ends.
func bridge(args []string, in io.Reader, out io.Writer, env cli.Env) int {
	stderr := env.Stderr
	fs := cli.FlagSet("oac-guest bridge")
	env.Usage = func(w io.Writer, _ *flag.FlagSet) {
		fmt.Fprintln(w, "usage: oac-guest bridge unix:///PATH\n\nRelays stdin and stdout to the agent's socket (its --transport unix+listen:///PATH).")
	}
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) != 1 {
		return cli.Usagef(fs, stderr, "want one unix:///PATH, the agent's --transport unix+listen:///PATH")
	}
	ep, err := transport.Parse(args[0])
	if err == nil && ep.Scheme != transport.SchemeUnix {
		err = fmt.Errorf("endpoint %s: the bridge connects to a unix:// socket", ep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oac-guest bridge:", err)
		return 2
	}
	// The host execs the bridge once the container runs, which may be
	// before the agent listens (a busy node): retry until it does.
	ctx, cancel := context.WithTimeout(context.Background(), bridgeWait)
	c, err := transport.DialRetry(ctx, ep)
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "oac-guest bridge:", err, "(is the agent waiting on --transport unix+listen:// with this path?)")
		return 1
	}
	if err := transport.Relay(c, in, out); err != nil {
		fmt.Fprintln(stderr, "oac-guest bridge:", err)
		return 1
	}
	return 0
}

// HelperArg runs oac-guest as the helper of a hosted sandbox with no shim
// beside it (package helper): the payload on stdin, events on stdout.
const HelperArg = "helper"

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// runHelper parses the helper's flags and runs it in a mount namespace of
// its own, as the subreaper of what it starts.
func runHelper(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-guest helper")
	env.Usage = func(w io.Writer, fs *flag.FlagSet) {
		fmt.Fprintln(w, "usage: oac-guest helper [flags]\n\nThe helper of a hosted sandbox with no shim beside it: the payload on stdin,\nevents as JSON lines on stdout, diagnostics on stderr.\n\nflags:")
		cli.PrintFlags(w, fs)
	}
	name := fs.String("name", helper.DefaultName, "the sandbox's name in the events")
	policy := fs.String("policy", "", "egress policy file (default: "+helper.DefaultPolicyFile+" when the image has it)")
	var allow, upstreams listFlag
	fs.Var(&allow, "allow", "allow egress to HOST:PORT, *.SUFFIX:PORT or CIDR:PORT (repeatable; as oac-shim's)")
	fs.Var(&upstreams, "upstream", "named upstream NAME:PORT=ADDR (repeatable; as oac-shim's)")
	tenant := fs.String("tenant", "", "the sandbox's tenant UUID (default: the payload's resource)")
	environment := fs.String("environment", "", "the sandbox's environment UUID")
	allocation := fs.String("allocation", "", "the sandbox's allocation UUID")
	debug := fs.Bool("debug", false, "log debug messages")
	pos, code, ok := cli.Parse(fs, args[1:], env)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(fs, stderr, "unexpected arguments %q; the payload comes on stdin (see oac-guest helper --help)", pos)
	}
	var id *bootstrap.Identity
	if *tenant != "" || *environment != "" || *allocation != "" {
		if *tenant == "" || *environment == "" || *allocation == "" {
			fmt.Fprintln(stderr, "oac-guest helper: --tenant, --environment and --allocation go together")
			return 2
		}
		id = &bootstrap.Identity{TenantID: *tenant, EnvironmentID: *environment, AllocationID: *allocation}
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "oac-guest", "mode", "helper")
	if code, ok := helper.InPrivateMounts(args, log); ok {
		return code
	}
	if os.Getpid() != 1 {
		if err := reaper.BecomeSubreaper(); err != nil {
			log.Warn("cannot become a subreaper: orphans of the workload are not reaped here", "err", err)
		}
	}
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// SIGHUP too (the parent forwards it): a hangup stops in order, never
	// kills the helper with its workload left running.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	return helper.Run(ctx, helper.Config{
		Name: *name, Stdin: os.Stdin, Events: stdout, Diag: stderr, Log: log,
		Reaper: reaper.New(), AgentVersion: buildinfo.Version,
		PolicyFile: *policy, Allow: allow, Upstreams: upstreams, Identity: id,
	})
}

// guestUsage is oac-guest --help.
func guestUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: oac-guest [flags]            the agent (PID 1 of a VM or container, a service, a child)
       oac-guest helper [flags]     a hosted sandbox's helper: the payload on stdin (--help)
       oac-guest bridge unix:///PATH
       oac-guest seed-kept DIR
       oac-guest version [--json]   the version (--json: schema/version.schema.json)

flags:
`)
	cli.PrintFlags(w, fs)
}

// versionCmd is oac-guest version [--json] (and --version).
func versionCmd(args []string, env cli.Env) int {
	fs := cli.FlagSet("oac-guest version")
	asJSON := fs.Bool("json", false, "print one JSON object (schema/version.schema.json)")
	pos, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(fs, env.Stderr, "takes no arguments, not %q", pos)
	}
	cli.PrintVersion(env.Stdout, "oac-guest", *asJSON)
	return 0
}
