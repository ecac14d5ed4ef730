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
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/host/egress"
	"github.com/oac/sandbox-agent/host/events"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/bwrap"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Providers maps --provider names to constructors.
var Providers = map[string]func() provider.Provider{
	"bwrap": func() provider.Provider { return &bwrap.Provider{} },
}

const usage = `usage:
  oac-shim run --provider bwrap --name NAME [--rootfs DIR] [--bootstrap FILE]
               [--events FILE] [--timeout DUR] [--boot-timeout DUR] [--agent PATH]
               [--allow RULE]... [--upstream NAME:PORT=ADDR]... [--policy FILE]
               [--egress-max-streams N] [--egress-connect-timeout DUR] [--egress-idle-timeout DUR]
  oac-shim check
  oac-shim version
`

// Main runs oac-shim with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "check":
		return checkCmd(stdout)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "oac-shim %s (protocol %d..%d)\n", buildinfo.Version, protocol.MinVersion, protocol.MaxVersion)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "oac-shim: unknown command %q\n%s", args[0], usage)
	return 2
}

func providerNames() []string {
	var names []string
	for n := range Providers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func checkCmd(stdout io.Writer) int {
	code := 1
	for _, n := range providerNames() {
		if err := Providers[n]().Check(context.Background()); err != nil {
			fmt.Fprintf(stdout, "%s: unavailable: %v\n", n, err)
			continue
		}
		code = 0
		fmt.Fprintf(stdout, "%s: available\n", n)
	}
	return code
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oac-shim run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prov := fs.String("provider", "bwrap", "provider: "+strings.Join(providerNames(), ", "))
	name := fs.String("name", "", "sandbox name (a-z, 0-9, '-'; required)")
	rootfs := fs.String("rootfs", "", "rootfs directory (default: read-only view of the host's /usr, /bin, /lib*, /etc essentials)")
	bootFile := fs.String("bootstrap", "", "bootstrap JSON file (default: no daemon)")
	eventsFile := fs.String("events", "", "write events to this file instead of stdout")
	timeout := fs.Duration("timeout", 0, "stop the sandbox in order after this long (0: run until SIGINT/SIGTERM)")
	bootTimeout := fs.Duration("boot-timeout", sandbox.DefaultBootTimeout, "fail if the guest is not ready within this long")
	agentPath := fs.String("agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	debug := fs.Bool("debug", false, "log debug messages")
	var allow, upstreams stringList
	fs.Var(&allow, "allow", "egress rule HOST:PORT, *.SUFFIX:PORT or CIDR:PORT (ports LO-HI allowed); repeatable")
	fs.Var(&upstreams, "upstream", "named egress upstream NAME:PORT=ADDR (e.g. llm-gateway:443=127.0.0.1:8443); repeatable")
	policyFile := fs.String("policy", "", "egress policy JSON file, re-read on SIGHUP (rules and upstreams add to --allow and --upstream)")
	maxStreams := fs.Int("egress-max-streams", egress.DefaultMaxStreams, "concurrent egress connections; the next one is refused with ResourceExhausted")
	connectTimeout := fs.Duration("egress-connect-timeout", egress.DefaultConnectTimeout, "bound on resolving and connecting one egress target")
	idleTimeout := fs.Duration("egress-idle-timeout", egress.DefaultIdleTimeout, "close an egress connection no byte crossed for this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "oac-shim run: unexpected arguments %q\n", fs.Args())
		return 2
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "oac-shim")
	fail := func(err error) int {
		fmt.Fprintf(stderr, "oac-shim: %v\n", err)
		return 1
	}
	newProv, ok := Providers[*prov]
	if !ok {
		fmt.Fprintf(stderr, "oac-shim run: unknown provider %q (have %s)\n", *prov, strings.Join(providerNames(), ", "))
		return 2
	}
	if *name == "" {
		fmt.Fprintln(stderr, "oac-shim run: --name is required")
		return 2
	}
	var boot *bootstrap.Bootstrap
	if *bootFile != "" {
		f, err := os.Open(*bootFile)
		if err != nil {
			return fail(fmt.Errorf("read bootstrap: %w", err))
		}
		boot, err = bootstrap.Decode(f)
		f.Close()
		if err != nil {
			return fail(fmt.Errorf("read bootstrap %s: %w", *bootFile, err))
		}
	}
	pol, err := egress.LoadPolicy(*policyFile, allow, upstreams)
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim run: %v\n", err)
		return 2
	}
	if *maxStreams < 1 || *connectTimeout <= 0 || *idleTimeout <= 0 {
		fmt.Fprintln(stderr, "oac-shim run: --egress-max-streams must be at least 1 and the egress timeouts positive")
		return 2
	}
	broker := egress.New(egress.Config{
		Policy: pol, MaxStreams: *maxStreams, ConnectTimeout: *connectTimeout, IdleTimeout: *idleTimeout,
		Log: log.With("part", "egress"),
	})
	if *agentPath == "" {
		p, err := defaultAgentPath()
		if err != nil {
			return fail(err)
		}
		*agentPath = p
	}
	out := stdout
	if *eventsFile != "" {
		f, err := os.OpenFile(*eventsFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			return fail(fmt.Errorf("open events file: %w", err))
		}
		defer f.Close()
		out = f
	}
	sink := events.NewJSONLines(out)
	p := newProv()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case sig := <-sigs:
			cancel(fmt.Errorf("received %s", sig))
		case <-ctx.Done():
		}
	}()
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	go reloadOnHUP(ctx, hups, *name, *policyFile, allow, upstreams, broker, sink, log)
	if *timeout > 0 {
		t := time.AfterFunc(*timeout, func() { cancel(fmt.Errorf("run time limit of %s reached", *timeout)) })
		defer t.Stop()
	}
	err = sandbox.Run(ctx, sandbox.Config{
		Name:        *name,
		Provider:    p,
		AgentPath:   *agentPath,
		Rootfs:      *rootfs,
		Bootstrap:   boot,
		Events:      sink,
		Log:         log,
		Diag:        stderr,
		BootTimeout: *bootTimeout,
		Egress:      broker,
	})
	if err != nil {
		if errors.Is(err, provider.ErrUnavailable) {
			fmt.Fprintln(stderr, "oac-shim: run 'oac-shim check' to see what this host is missing")
		}
		return fail(err)
	}
	return 0
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// reloadOnHUP re-reads the policy (file plus flags) on SIGHUP and swaps it
// in; a policy that fails to load leaves the old one in force.
func reloadOnHUP(ctx context.Context, hups <-chan os.Signal, name, file string, allow, ups []string, b *egress.Broker, sink events.Sink, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hups:
		}
		pol, err := egress.LoadPolicy(file, allow, ups)
		var e events.Event
		if err != nil {
			log.Warn("egress policy reload failed; the previous policy stays in force", "err", err)
			e = b.PolicyEvent("policy reload failed, previous policy kept (" + err.Error() + ")")
		} else {
			b.SetPolicy(pol)
			e = b.PolicyEvent("egress policy replaced")
		}
		e.Time, e.Sandbox = time.Now().UTC(), name
		sink.Emit(e)
	}
}

func defaultAgentPath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find oac-guest: %w (pass --agent PATH)", err)
	}
	p := filepath.Join(filepath.Dir(exe), "oac-guest")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("find oac-guest beside oac-shim at %s: %w (build it with make build or pass --agent PATH)", p, err)
	}
	return p, nil
}
