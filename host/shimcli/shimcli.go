package shimcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/host/egress"
	"github.com/oac/sandbox-agent/host/events"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/bwrap"
	"github.com/oac/sandbox-agent/host/provider/qemu"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
)

// ProviderFlags are the provider-specific flags of run and check.
type ProviderFlags struct {
	// SingleUID allows bwrap's rootless fallback without subordinate ids.
	SingleUID bool
	// qemu
	Kernel, Initramfs, Accel, VMTransport string
	Memory                                int
	HostGrace                             time.Duration
}

func (pf *ProviderFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&pf.SingleUID, "single-uid", false, "bwrap without root and without subordinate ids: run with one uid (guest uid 1000 is you; there is no guest root)")
	fs.StringVar(&pf.Kernel, "kernel", "", "qemu: kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)")
	fs.StringVar(&pf.Initramfs, "initramfs", "", "qemu: initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)")
	fs.StringVar(&pf.Accel, "accel", qemu.AccelAuto, "qemu: accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg")
	fs.IntVar(&pf.Memory, "memory", qemu.DefaultMemory, "qemu: guest memory in MiB")
	fs.StringVar(&pf.VMTransport, "vm-transport", qemu.TransportSerial, "qemu: serial (virtio-serial) or vsock (needs /dev/vhost-vsock)")
	fs.DurationVar(&pf.HostGrace, "host-grace", 0, "qemu: the guest powers off after the host is gone this long (0: the guest's default, 30s)")
}

func newQemu(f ProviderFlags) provider.Provider {
	q := &qemu.Provider{Kernel: f.Kernel, Initramfs: f.Initramfs, Accel: f.Accel, MemoryMiB: f.Memory, Transport: f.VMTransport, HostGrace: f.HostGrace}
	if q.Kernel == "" {
		q.Kernel = besideShim("vmlinuz")
	}
	if q.Initramfs == "" {
		q.Initramfs = besideShim("initramfs.img")
	}
	return q
}

// Providers maps --provider names to constructors.
var Providers = map[string]func(ProviderFlags) provider.Provider{
	"bwrap": func(f ProviderFlags) provider.Provider { return &bwrap.Provider{SingleUID: f.SingleUID} },
	"qemu":  newQemu,
}

const usage = `usage:
  oac-shim run --provider bwrap|qemu --name NAME [--rootfs DIR] [--bootstrap FILE]
               [--events FILE] [--timeout DUR] [--boot-timeout DUR] [--agent PATH]
               [--single-uid]
               [--kernel FILE] [--initramfs FILE] [--accel auto|kvm|tcg]
               [--memory MIB] [--vm-transport serial|vsock] [--host-grace DUR]
               [--allow RULE]... [--upstream NAME:PORT=ADDR]... [--policy FILE]
               [--egress-max-streams N] [--egress-connect-timeout DUR] [--egress-idle-timeout DUR]
               [--tenant UUID --environment UUID --allocation UUID] [--allow-loopback-link]
               [--sandbox-io PATH] [--install NAME=PATH]... [--volume DIR=HOSTDIR]...
               [--password-file FILE]
  oac-shim check [--single-uid]
  oac-shim version
`

// Main runs oac-shim with args (without the program name) and returns the
// exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdin, stdout, stderr)
	case "check":
		return checkCmd(args[1:], stdout, stderr)
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

func checkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oac-shim check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var pf ProviderFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	code := 1
	for _, n := range providerNames() {
		p := Providers[n](pf)
		if err := p.Check(context.Background()); err != nil {
			fmt.Fprintf(stdout, "%s: unavailable: %v\n", n, err)
			continue
		}
		code = 0
		detail := ""
		if d, ok := p.(interface{ Detail(context.Context) string }); ok {
			if s := d.Detail(context.Background()); s != "" {
				detail = " (" + s + ")"
			}
		}
		fmt.Fprintf(stdout, "%s: available%s\n", n, detail)
	}
	return code
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
