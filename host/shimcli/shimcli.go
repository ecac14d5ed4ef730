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
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
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
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// ProviderFlags are the provider-specific flags of run and check.
type ProviderFlags struct {
	// SingleUID allows bwrap's rootless fallback without subordinate ids.
	SingleUID bool
	// qemu
	Kernel, Initramfs, Accel, VMTransport string
	Memory                                int
	HostGrace                             time.Duration
	// oci
	Runtime       string
	OCINoNewPrivs bool
	// wsl
	WSL, WSLInstaller string
	// docker
	Docker, DockerImage string
	// qemu and vz: a raw disk attached read-only; vz: a shared directory
	// (vz also uses Kernel, Initramfs, Memory and HostGrace)
	Disk, Share string
	CPUs        int
}

func (pf *ProviderFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&pf.SingleUID, "single-uid", false, "bwrap without root and without subordinate ids: run with one uid (guest uid 1000 is you; there is no guest root)")
	fs.StringVar(&pf.Kernel, "kernel", "", "qemu: kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)")
	fs.StringVar(&pf.Initramfs, "initramfs", "", "qemu: initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)")
	fs.StringVar(&pf.Disk, "disk", "", "qemu, vz: raw disk image attached read-only as virtio-blk (the guest sees /dev/vda; oac-image build makes disk.ext4 and disk.erofs)")
	fs.StringVar(&pf.Accel, "accel", qemu.AccelAuto, "qemu: accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg")
	fs.IntVar(&pf.Memory, "memory", qemu.DefaultMemory, "qemu: guest memory in MiB")
	fs.StringVar(&pf.VMTransport, "vm-transport", qemu.TransportSerial, "qemu: serial (virtio-serial) or vsock (needs /dev/vhost-vsock)")
	fs.DurationVar(&pf.HostGrace, "host-grace", 0, "qemu: the guest powers off after the host is gone this long (0: the guest's default, 30s)")
	fs.StringVar(&pf.Runtime, "runtime", "", "oci: runc, crun or the path of one (default: runc, else crun)")
	fs.StringVar(&pf.WSL, "wsl", "", `wsl: wsl.exe to run (default: %SystemRoot%\System32\wsl.exe)`)
	fs.StringVar(&pf.WSLInstaller, "wsl-installer", "", "wsl: URL of the mirrored WSL installer named when WSL is missing or too old")
	fs.StringVar(&pf.Docker, "docker", "", "docker: the docker client (default: docker in PATH)")
	fs.StringVar(&pf.DockerImage, "docker-image", "", "docker: the guest image to run (never pulled)")
	fs.StringVar(&pf.Share, "share", "", "vz: host directory shared with the guest over virtio-fs (tag workspace)")
	fs.IntVar(&pf.CPUs, "cpus", 0, "vz: virtual CPUs (default 2, at most the host's)")
	fs.BoolVar(&pf.OCINoNewPrivs, "oci-no-new-privs", true, "oci: set no-new-privileges on the agent itself (the daemon always gets it)")
}

func newQemu(f ProviderFlags) provider.Provider {
	q := &qemu.Provider{Kernel: f.Kernel, Initramfs: f.Initramfs, Disk: f.Disk, Accel: f.Accel, MemoryMiB: f.Memory, Transport: f.VMTransport, HostGrace: f.HostGrace}
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
		return &wsl.Provider{WSL: f.WSL, InstallerURL: f.WSLInstaller, Rootfs: besideShim("oac-rootfs.tar.gz")}
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
               qemu:   [--kernel FILE] [--initramfs FILE] [--disk FILE] [--accel auto|kvm|tcg]
                       [--memory MIB] [--vm-transport serial|vsock] [--host-grace DUR]
               oci:    [--runtime runc|crun|PATH] [--oci-no-new-privs=false]
               docker: --docker-image IMAGE [--docker PATH]
               wsl:    [--wsl PATH] [--wsl-installer URL] (--rootfs is the tarball)
               vz:     [--kernel FILE] [--initramfs FILE] [--memory MIB] [--cpus N]
                       [--disk FILE] [--share DIR] [--host-grace DUR]
  oac-shim check [--json] [provider flags]
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
	var pf ProviderFlags
	pf.register(fs)
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
	// Host paths are resolved here, once: runtimes run in other working
	// directories (qemu and the OCI runtimes in /), where a relative path
	// would name something else or nothing.
	for _, p := range []*string{rootfs, agentPath, sandboxIO, &pf.Kernel, &pf.Initramfs, &pf.Disk, &pf.Share} {
		*p = absPath(*p)
	}
	for _, m := range []installFlag{installs, volumes} {
		for k, v := range m {
			m[k] = absPath(v)
		}
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
	verdict := ospolicy.Evaluate(detectOS())
	switch verdict.Level {
	case ospolicy.Block:
		return fail(errors.New(verdict.Message))
	case ospolicy.Warn:
		log.Warn(verdict.Message)
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
	p := newProv(pf)
	if pf.SingleUID && os.Geteuid() != 0 {
		log.Warn(bwrap.SingleUIDLoss)
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
