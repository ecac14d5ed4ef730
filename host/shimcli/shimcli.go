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
               [--tenant UUID --environment UUID --allocation UUID] [--allow-loopback-link]
               [--sandbox-io PATH] [--install NAME=PATH]... [--volume DIR=HOSTDIR]...
               [--password-file FILE]
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
	tenant := fs.String("tenant", "", "this sandbox's tenant id (a hosted sandbox: the sandbox_io resource must name it)")
	environment := fs.String("environment", "", "this sandbox's environment id")
	allocation := fs.String("allocation", "", "this sandbox's allocation id")
	allowLoopback := fs.Bool("allow-loopback-link", false, "accept a ws:// or wss:// link URL on a loopback host (development only)")
	sandboxIO := fs.String("sandbox-io", "", "host binary to install as /usr/local/bin/oac-sandbox-io in the guest")
	installs := installFlag{}
	fs.Var(installs, "install", "NAME=PATH: install a host binary as /usr/local/bin/NAME in the guest (repeatable)")
	volumes := installFlag{}
	fs.Var(volumes, "volume", "GUESTDIR=HOSTDIR: bind a host directory as the guest's /home or /environment (a persistent volume; default a fresh tmpfs)")
	passwordFile := fs.String("password-file", "", "write the daemon's password (generated when the bootstrap has none) to this new file, mode 0600")
	debug := fs.Bool("debug", false, "log debug messages")
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
	// Input errors are reported like every other failure: one failed
	// event (the last event is always failed or stopped) and a reason.
	inputFail := func(err error) int {
		err = fmt.Errorf("invalid bootstrap, nothing created: %w", err)
		sink.Emit(events.Event{Time: time.Now().UTC(), Sandbox: *name, Event: events.KindState, State: events.StateFailed, Message: err.Error()})
		return fail(err)
	}
	var boot *bootstrap.Bootstrap
	if *bootFile != "" {
		f, err := os.Open(*bootFile)
		if err != nil {
			return inputFail(fmt.Errorf("read %s: %w", *bootFile, err))
		}
		boot, err = bootstrap.Decode(f)
		f.Close()
		if err != nil {
			return inputFail(fmt.Errorf("read %s: %w", *bootFile, err))
		}
	}
	if *tenant != "" || *environment != "" || *allocation != "" || *allowLoopback {
		if *tenant == "" || *environment == "" || *allocation == "" {
			fmt.Fprintln(stderr, "oac-shim run: --tenant, --environment and --allocation go together")
			return 2
		}
		if boot == nil {
			boot = &bootstrap.Bootstrap{Version: bootstrap.Version}
		}
		id := &bootstrap.Identity{TenantID: *tenant, EnvironmentID: *environment, AllocationID: *allocation, AllowLoopbackLink: *allowLoopback}
		if b := boot.Sandbox; b != nil {
			if b.TenantID != id.TenantID || b.EnvironmentID != id.EnvironmentID || b.AllocationID != id.AllocationID {
				return inputFail(errors.New("the bootstrap's sandbox identity differs from --tenant, --environment and --allocation"))
			}
			id.AllowLoopbackLink = id.AllowLoopbackLink || b.AllowLoopbackLink
		}
		boot.Sandbox = id
	}
	if *agentPath == "" {
		p, err := defaultAgentPath()
		if err != nil {
			return fail(err)
		}
		*agentPath = p
	}
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
	if *timeout > 0 {
		t := time.AfterFunc(*timeout, func() { cancel(fmt.Errorf("run time limit of %s reached", *timeout)) })
		defer t.Stop()
	}
	err := sandbox.Run(ctx, sandbox.Config{
		Name:        *name,
		Provider:    p,
		AgentPath:   *agentPath,
		Rootfs:      *rootfs,
		Bootstrap:   boot,
		Events:      sink,
		Log:         log,
		Diag:        stderr,
		BootTimeout: *bootTimeout,

		SandboxIOPath: *sandboxIO,
		Install:       installs,
		Volumes:       volumes,
		PasswordFile:  *passwordFile,
	})
	if err != nil {
		if errors.Is(err, provider.ErrUnavailable) {
			fmt.Fprintln(stderr, "oac-shim: run 'oac-shim check' to see what this host is missing")
		}
		return fail(err)
	}
	return 0
}

// installFlag collects --install NAME=PATH and --volume DIR=HOSTDIR.
type installFlag map[string]string

func (f installFlag) String() string { return "" }

func (f installFlag) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return errors.New("want NAME=PATH")
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("%s given twice", name)
	}
	f[name] = path
	return nil
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
