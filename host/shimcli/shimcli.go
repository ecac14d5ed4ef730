package shimcli

import (
	"context"
	"encoding/json"
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
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/bwrap"
	"github.com/oac/sandbox-agent/host/provider/docker"
	"github.com/oac/sandbox-agent/host/provider/oci"
	"github.com/oac/sandbox-agent/host/provider/qemu"
	"github.com/oac/sandbox-agent/host/provider/vz"
	"github.com/oac/sandbox-agent/host/provider/wsl"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
)

// ProviderFlags are the provider-specific flags of run and check.
type ProviderFlags struct {
	// SingleUID allows bwrap's rootless fallback without subordinate ids.
	SingleUID bool
	// qemu
	Kernel, Initramfs, Accel, VMTransport, Arch, Firmware string
	Memory                                                int
	HostGrace                                             time.Duration
	// oci
	Runtime       string
	OCINoNewPrivs bool
	// wsl
	WSL string
	// Manifest is the pinned manifest (wsl: the WSL installer).
	Manifest string
	// docker
	Docker, DockerImage string
	// qemu and vz: the image's root disk (attached read-only) and the
	// workspace shared over virtio-fs (vz also uses Kernel, Initramfs,
	// Memory and HostGrace)
	Disk, Share string
	CPUs        int
}

func (pf *ProviderFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&pf.SingleUID, "single-uid", false, "bwrap without root and without subordinate ids: run with one uid (guest uid 1000 is you; there is no guest root)")
	fs.StringVar(&pf.Kernel, "kernel", "", "qemu: kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)")
	fs.StringVar(&pf.Initramfs, "initramfs", "", "qemu: initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)")
	fs.StringVar(&pf.Disk, "disk", "", "qemu, vz: the image's root disk (oac-image build's disk.ext4 or disk.erofs), attached read-only: the guest boots from it (without it, from its initramfs)")
	fs.StringVar(&pf.Arch, "arch", "", "qemu: guest architecture, amd64 or arm64 (default: the kernel image's)")
	fs.StringVar(&pf.Firmware, "firmware", "", "qemu: UEFI firmware to boot the kernel through (default for arm64: "+qemu.DefaultARM64Firmware+" when installed)")
	fs.StringVar(&pf.Accel, "accel", qemu.AccelAuto, "qemu: accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg")
	fs.IntVar(&pf.Memory, "memory", qemu.DefaultMemory, "qemu: guest memory in MiB")
	fs.StringVar(&pf.VMTransport, "vm-transport", qemu.TransportSerial, "qemu: serial (virtio-serial) or vsock (needs /dev/vhost-vsock)")
	fs.DurationVar(&pf.HostGrace, "host-grace", 0, "qemu: the guest powers off after the host is gone this long (0: the guest's default, 30s)")
	fs.StringVar(&pf.Runtime, "runtime", "", "oci: runc, crun or the path of one (default: runc, else crun)")
	fs.StringVar(&pf.WSL, "wsl", "", `wsl: wsl.exe to run (default: %SystemRoot%\System32\wsl.exe)`)
	fs.StringVar(&pf.Manifest, "manifest", "", "the pinned manifest (oac-image build --base-url); wsl: its wsl-installer is named when WSL is missing or too old (default: manifest.json beside oac-shim, when there)")
	fs.StringVar(&pf.Docker, "docker", "", "docker: the docker client (default: docker in PATH)")
	fs.StringVar(&pf.DockerImage, "docker-image", "", "docker: the guest image to run (never pulled)")
	fs.StringVar(&pf.Share, "share", "", "qemu, vz: host directory shared with the guest over virtio-fs as its workspace, /environment/workspace (tag workspace)")
	fs.IntVar(&pf.CPUs, "cpus", 0, "vz: virtual CPUs (default 2, at most the host's)")
	fs.BoolVar(&pf.OCINoNewPrivs, "oci-no-new-privs", true, "oci: set no-new-privileges on the agent itself (the daemon always gets it)")
}

func newQemu(f ProviderFlags) provider.Provider {
	q := &qemu.Provider{Kernel: f.Kernel, Initramfs: f.Initramfs, Arch: f.Arch, Firmware: f.Firmware, Disk: f.Disk, Share: f.Share,
		Accel: f.Accel, MemoryMiB: f.Memory, Transport: f.VMTransport, HostGrace: f.HostGrace}
	if q.Kernel == "" {
		q.Kernel = besideShim("vmlinuz")
	}
	if q.Initramfs == "" {
		q.Initramfs = besideShim("initramfs.img")
	}
	return q
}

func newVZ(f ProviderFlags) provider.Provider {
	s := vz.Settings{Kernel: f.Kernel, Initramfs: f.Initramfs, Disk: f.Disk, Share: f.Share, CPUs: f.CPUs, HostGrace: f.HostGrace}
	if f.Memory != qemu.DefaultMemory {
		s.MemoryMiB = f.Memory
	}
	if s.Kernel == "" {
		s.Kernel = besideShim("vmlinuz")
	}
	if s.Initramfs == "" {
		s.Initramfs = besideShim("initramfs.img")
	}
	return &vz.Provider{Settings: s}
}

// Providers maps --provider names to constructors.
var Providers = map[string]func(ProviderFlags) provider.Provider{
	"bwrap": func(f ProviderFlags) provider.Provider { return &bwrap.Provider{SingleUID: f.SingleUID} },
	"qemu":  newQemu,
	"docker": func(f ProviderFlags) provider.Provider {
		return &docker.Provider{Docker: f.Docker, Image: f.DockerImage}
	},
	"vz": newVZ,
	"wsl": func(f ProviderFlags) provider.Provider {
		m := f.Manifest
		if m == "" {
			if p := besideShim("manifest.json"); p != "" {
				if _, err := os.Stat(p); err == nil {
					m = p
				}
			}
		}
		return &wsl.Provider{WSL: f.WSL, Manifest: m, Rootfs: besideShim("oac-rootfs.tar.gz")}
	},
	"oci": func(f ProviderFlags) provider.Provider {
		return &oci.Provider{Runtime: f.Runtime, NoNewPrivileges: f.OCINoNewPrivs}
	},
}

const usage = `usage:
  oac-shim run --provider bwrap|docker|oci|qemu|vz|wsl --name NAME [--rootfs DIR|FILE]
               [--bootstrap FILE] [--events FILE] [--timeout DUR] [--boot-timeout DUR]
               [--agent PATH] [--password-file FILE]
               egress: [--allow RULE]... [--upstream NAME:PORT=ADDR]... [--policy FILE]
                       [--egress-max-streams N] [--egress-connect-timeout DUR] [--egress-idle-timeout DUR]
               contract: [--tenant UUID --environment UUID --allocation UUID] [--allow-loopback-link]
                       [--sandbox-io PATH] [--install NAME=PATH]... [--volume DIR=HOSTDIR]...
               bwrap:  [--single-uid]
               qemu:   [--kernel FILE] [--initramfs FILE] [--disk FILE] [--share DIR] [--arch amd64|arm64]
                       [--firmware FILE] [--accel auto|kvm|tcg] [--memory MIB]
                       [--vm-transport serial|vsock] [--host-grace DUR]
               oci:    [--runtime runc|crun|PATH] [--oci-no-new-privs=false]
               docker: --docker-image IMAGE [--docker PATH]
               wsl:    [--wsl PATH] [--manifest FILE] (--rootfs is the tarball)
               vz:     [--kernel FILE] [--initramfs FILE] [--memory MIB] [--cpus N]
                       [--disk FILE] [--share DIR] [--host-grace DUR] (arm64 images on Apple silicon)
  oac-shim check [--json] [provider flags]
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

// CheckReport is what `oac-shim check --json` prints.
type CheckReport struct {
	OS        ospolicy.OS      `json:"os"`
	Policy    ospolicy.Verdict `json:"policy"`
	Providers []ProviderStatus `json:"providers"`
}

// ProviderStatus says whether one provider can run here.
type ProviderStatus struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Reason says why not, and what to do (unavailable only).
	Reason string `json:"reason,omitempty"`
	// Detail says how sandboxes would run (available only).
	Detail string `json:"detail,omitempty"`
}

// detectOS is replaced in tests.
var detectOS = ospolicy.Detect

// Check gathers the report of oac-shim check.
func Check(ctx context.Context, pf ProviderFlags) CheckReport {
	o := detectOS()
	r := CheckReport{OS: o, Policy: ospolicy.Evaluate(o)}
	for _, n := range providerNames() {
		p := Providers[n](pf)
		st := ProviderStatus{Name: n}
		if err := p.Check(ctx); err != nil {
			st.Reason = err.Error()
		} else {
			st.Available = true
			if d, ok := p.(interface{ Detail(context.Context) string }); ok {
				st.Detail = d.Detail(ctx)
			}
		}
		r.Providers = append(r.Providers, st)
	}
	return r
}

func checkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oac-shim check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	var pf ProviderFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	r := Check(context.Background(), pf)
	code := 1
	for _, p := range r.Providers {
		if p.Available {
			code = 0
		}
	}
	if r.Policy.Level == ospolicy.Block {
		code = 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
		return code
	}
	fmt.Fprintf(stdout, "os: %s\n", r.OS.Name)
	fmt.Fprintf(stdout, "policy: %s: %s\n", r.Policy.Level, r.Policy.Message)
	for _, p := range r.Providers {
		if !p.Available {
			fmt.Fprintf(stdout, "%s: unavailable: %s\n", p.Name, p.Reason)
			continue
		}
		detail := ""
		if p.Detail != "" {
			detail = " (" + p.Detail + ")"
		}
		fmt.Fprintf(stdout, "%s: available%s\n", p.Name, detail)
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

// absPath makes a host path given on the command line absolute; "" stays "".
func absPath(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
