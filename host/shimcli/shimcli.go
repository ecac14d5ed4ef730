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
	"github.com/oac/sandbox-agent/host/provider/qemu"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Providers maps --provider names to constructors.
var Providers = map[string]func() provider.Provider{
	"bwrap": func() provider.Provider { return &bwrap.Provider{} },
	"qemu": func() provider.Provider {
		return &qemu.Provider{Kernel: besideShim("vmlinuz"), Initramfs: besideShim("initramfs.img")}
	},
}

const usage = `usage:
  oac-shim run --provider bwrap|qemu --name NAME [--rootfs DIR] [--bootstrap FILE]
               [--events FILE] [--timeout DUR] [--boot-timeout DUR] [--agent PATH]
               [--kernel FILE] [--initramfs FILE] [--accel auto|kvm|tcg]
               [--memory MIB] [--vm-transport serial|vsock] [--host-grace DUR]
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
	kernel := fs.String("kernel", "", "qemu: kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)")
	initrd := fs.String("initramfs", "", "qemu: initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)")
	accel := fs.String("accel", qemu.AccelAuto, "qemu: accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg")
	memory := fs.Int("memory", qemu.DefaultMemory, "qemu: guest memory in MiB")
	vmTransport := fs.String("vm-transport", qemu.TransportSerial, "qemu: serial (virtio-serial) or vsock (needs /dev/vhost-vsock)")
	hostGrace := fs.Duration("host-grace", 0, "qemu: the guest powers off after the host is gone this long (0: the guest's default, 30s)")
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
	p := newProv()
	if q, ok := p.(*qemu.Provider); ok {
		if *kernel != "" {
			q.Kernel = *kernel
		}
		if *initrd != "" {
			q.Initramfs = *initrd
		}
		q.Accel, q.MemoryMiB, q.Transport, q.HostGrace = *accel, *memory, *vmTransport, *hostGrace
	}
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
		Events:      events.NewJSONLines(out),
		Log:         log,
		Diag:        stderr,
		BootTimeout: *bootTimeout,
	})
	if err != nil {
		if errors.Is(err, provider.ErrUnavailable) {
			fmt.Fprintln(stderr, "oac-shim: run 'oac-shim check' to see what this host is missing")
		}
		return fail(err)
	}
	return 0
}

// besideShim returns the path of name in oac-shim's directory ("" when the
// executable cannot be found).
func besideShim(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), name)
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
