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
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
)

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

func checkCmd(args []string, env cli.Env) int {
	stdout := env.Stdout
	fs := cli.FlagSet("oac-shim check")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	providers := provider.Declare(fs)
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) > 0 {
		return cli.Usagef(fs, env.Stderr, "takes no arguments, not %q", args)
	}
	r := Check(context.Background(), providers)
	code = 1
	for _, p := range r.Providers {
		if p.Available {
			code = 0
		}
	}
	if r.Policy.Level == ospolicy.Block {
		code = 1
	}
	if *asJSON {
		cli.PrintJSON(stdout, r)
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

// sandboxName is the one NAME argument of cmd (oac-shim attach, claim):
// a usage error (exit 2, said on stderr) when it is missing or not a
// sandbox name.
func sandboxName(cmd string, fs *flag.FlagSet, args []string, stderr io.Writer) (string, int) {
	name, err := cli.Name(fs, args)
	if err != nil {
		return "", cli.Usagef(fs, stderr, "%v", err)
	}
	if !provider.ValidName(name) {
		fmt.Fprintf(stderr, "oac-shim %s: %q is not a sandbox name (1 to 63 characters of a-z, 0-9 and '-')\n", cmd, name)
		return "", api.ExitUsage
	}
	return name, 0
}
