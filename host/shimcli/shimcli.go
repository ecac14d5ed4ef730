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
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
)

// usageHead and usageTail frame the providers' own flags in usage.
const usageHead = `usage:
  oac-shim run --provider %s --name NAME [--rootfs DIR|FILE]
               [--bootstrap FILE] [--events FILE] [--timeout DUR] [--boot-timeout DUR]
               [--agent PATH] [--password-stdin | --password-file FILE | --password-fd N]
               [--clock-interval DUR] [--control stdin] [--control-socket PATH] [--outlive-parent]
               egress: [--allow RULE]... [--upstream NAME:PORT=ADDR]... [--policy FILE]
                       [--egress-max-streams N] [--egress-connect-timeout DUR] [--egress-idle-timeout DUR]
                       [--data-plane auto|off|fd|dial|direct]
               contract: [--tenant UUID --environment UUID --allocation UUID] [--allow-loopback-link]
                       [--sandbox-io PATH] [--install NAME=PATH]... [--volume DIR=HOSTDIR]...
`

const usageTail = `
  run is a throwaway sandbox: created, started and destroyed when the shim exits.
  A kept sandbox outlives its runs (its /home, /environment and /usr/local):
  oac-shim create --provider P --name NAME [--rootfs DIR|FILE] [--sandbox-io PATH]
                  [--install NAME=PATH]... [provider flags] [--agent PATH] [--keep-root DIR]
  oac-shim start --name NAME [--keep-root DIR] [the run flags but --provider, --rootfs,
                  --sandbox-io, --install, --volume and provider flags, fixed at create]
  oac-shim reset --name NAME [--keep-root DIR] [--agent PATH]   back to the pristine image
  oac-shim destroy --name NAME [--keep-root DIR]                every byte it kept
  oac-shim list [--json] [--keep-root DIR]                      name, provider, image, state, size

  Many sandboxes from one parent (the keep root's running ones, run and start alike):
  oac-shim list --running [--json] [--keep-root DIR]            name, kind, provider, pid, control socket
  oac-shim stop [--grace DUR] [--json] [--keep-root DIR] (NAME... | --all)
                                                                 in order, each within the grace
  oac-shim attach NAME [--from SEQ|now] [--keep-root DIR]        a sandbox run with --outlive-parent:
                                                                 its events replayed and followed,
                                                                 commands on stdin, answers on stdout

  oac-shim check [--json] [provider flags]
  oac-shim version
`

// usage is oac-shim's usage text, with each registered provider's flags.
func usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, usageHead, strings.Join(provider.Names(), "|"))
	flags := provider.Usage()
	for _, name := range provider.Names() {
		indent := fmt.Sprintf("               %-7s ", name+":")
		line := indent
		for _, part := range strings.SplitAfter(flags[name], "] ") {
			if len(line)+len(part) > 90 && line != indent {
				b.WriteString(strings.TrimRight(line, " ") + "\n")
				line = strings.Repeat(" ", len(indent))
			}
			line += part
		}
		b.WriteString(line + "\n")
	}
	b.WriteString(usageTail)
	return b.String()
}

// Main runs oac-shim with args (without the program name) and returns the
// exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdin, stdout, stderr)
	case "create":
		return createCmd(args[1:], stdout, stderr)
	case "start":
		return startCmd(args[1:], stdin, stdout, stderr)
	case "reset":
		return resetCmd(args[1:], stdout, stderr)
	case "destroy":
		return destroyCmd(args[1:], stdout, stderr)
	case "list":
		return listCmd(args[1:], stdout, stderr)
	case "stop":
		return stopCmd(args[1:], stdout, stderr)
	case "attach":
		return attachCmd(args[1:], stdin, stdout, stderr)
	case "check":
		return checkCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "oac-shim %s (protocol %d..%d)\n", buildinfo.Version, protocol.MinVersion, protocol.MaxVersion)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	fmt.Fprintf(stderr, "oac-shim: unknown command %q\n%s", args[0], usage())
	return 2
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
	// Honours lists the optional run flags the provider carries into
	// its guests (--rootfs, --sandbox-io, --install, --volume); run
	// refuses the others before anything is created.
	Honours []string `json:"honours"`
	// Workload says how oac-sandbox-io and the daemon are confined in
	// this provider's sandboxes here, limits included (available only).
	Workload string `json:"workload,omitempty"`
}

// detectOS is replaced in tests.
var detectOS = ospolicy.Detect

// osVerdict is the OS policy's verdict on this host: the one place it is
// evaluated, for run and for check.
func osVerdict() (ospolicy.OS, ospolicy.Verdict) {
	o := detectOS()
	return o, ospolicy.Evaluate(o)
}

// Check gathers the report of oac-shim check from the providers' own
// Check and Detail. On an OS the policy blocks, no provider is available.
func Check(ctx context.Context, providers map[string]func() provider.Provider) CheckReport {
	o, v := osVerdict()
	r := CheckReport{OS: o, Policy: v}
	for _, n := range provider.Names() {
		p := providers[n]()
		st := ProviderStatus{Name: n, Honours: []string{}}
		for _, f := range provider.Honours(p) {
			st.Honours = append(st.Honours, string(f))
		}
		switch err := p.Check(ctx); {
		case v.Level == ospolicy.Block:
			st.Reason = v.Message
		case err != nil:
			st.Reason = err.Error()
		default:
			st.Available = true
			if d, ok := p.(provider.Detailer); ok {
				st.Detail = d.Detail(ctx)
			}
			if c, ok := p.(provider.Confiner); ok {
				st.Workload = c.Workload(ctx)
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
	providers := provider.Declare(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	r := Check(context.Background(), providers)
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
		fmt.Fprintf(stdout, "%s: available%s; honours %s\n", p.Name, detail, honoursList(p.Honours))
		if p.Workload != "" {
			fmt.Fprintf(stdout, "  workload: %s\n", p.Workload)
		}
	}
	return code
}

func honoursList(fs []string) string {
	if len(fs) == 0 {
		return "none of --rootfs, --sandbox-io, --install, --volume"
	}
	return strings.Join(fs, ", ")
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// reloadOnHUP re-reads the policy (file plus flags) on SIGHUP and swaps it
// in; a policy that fails to load leaves the old one in force.
func reloadOnHUP(ctx context.Context, hups <-chan os.Signal, name, file string, allow, ups []string, b *egress.Broker, sink api.Sink, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hups:
		}
		pol, err := egress.LoadPolicy(file, allow, ups)
		var e api.Event
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
