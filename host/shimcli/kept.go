package shimcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
)

// The commands of kept sandboxes (create, start, reset, destroy, list):
// flags in, package kept's Service, lines out.

// keptService opens the kept sandboxes under root, saying what it finds
// on stderr (replaced in tests).
var keptService = func(root string, stderr io.Writer) *kept.Service {
	return kept.Open(root, func(m string) { fmt.Fprintf(stderr, "oac-shim: %s\n", m) })
}

// providerFlagNames are the flags the registered providers define.
func providerFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	provider.Declare(fs)
	names := map[string]bool{}
	fs.VisitAll(func(fl *flag.Flag) { names[fl.Name] = true })
	return names
}

// createFlagsGiven lists the create flags given on fs (oac-shim start
// refuses them: the record has them).
func createFlagsGiven(fs *flag.FlagSet) []string {
	prov := providerFlagNames()
	var given []string
	fs.Visit(func(fl *flag.Flag) {
		switch {
		case fl.Name == "provider", fl.Name == "rootfs", fl.Name == "sandbox-io", fl.Name == "install", fl.Name == "volume", prov[fl.Name]:
			given = append(given, "--"+fl.Name)
		}
	})
	return given
}

// recordedProviderFlags returns the provider flags given on fs, as the
// record keeps them.
func recordedProviderFlags(fs *flag.FlagSet) []string {
	prov := providerFlagNames()
	var out []string
	fs.Visit(func(fl *flag.Flag) {
		if prov[fl.Name] {
			out = append(out, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return out
}

// keptCmd is the common part of create, reset, destroy and list.
type keptCmd struct {
	name, keepRoot string
	stdout, stderr io.Writer
	env            cli.Env
}

func (c *keptCmd) service() *kept.Service { return keptService(c.keepRoot, c.stderr) }

func (c *keptCmd) fail(err error) int {
	fmt.Fprintf(c.stderr, "oac-shim: %v\n", err)
	if errors.Is(err, persist.ErrLocked) {
		fmt.Fprintln(c.stderr, "oac-shim: stop the shim that runs it first (its control API's stop, or SIGTERM)")
	}
	return failure.Exit(err)
}

func keptFlagSet(cmd string, c *keptCmd, env cli.Env) *flag.FlagSet {
	fs := cli.FlagSet("oac-shim " + cmd)
	fs.StringVar(&c.keepRoot, "keep-root", "", "where kept sandboxes live (default "+persist.DefaultRoot()+")")
	if cmd != "list" {
		fs.StringVar(&c.name, "name", "", "the sandbox's name, as the NAME argument (kept for callers that pass it)")
	}
	c.stdout, c.stderr, c.env = env.Stdout, env.Stderr, env
	return fs
}

// parseKept parses a kept command's flags and its NAME (needName), or
// no argument (list). ok false: return code.
func parseKept(fs *flag.FlagSet, c *keptCmd, args []string, needName bool) (code int, ok bool) {
	args, code, ok = cli.Parse(fs, args, c.env)
	if !ok {
		return code, false
	}
	if !needName {
		if len(args) > 0 {
			return cli.Usagef(fs, c.stderr, "takes no arguments, not %q", args), false
		}
		return 0, true
	}
	name, err := cli.Name(fs, args)
	if err != nil {
		return cli.Usagef(fs, c.stderr, "%v", err), false
	}
	if !provider.ValidName(name) {
		return cli.Usagef(fs, c.stderr, "%q is not a sandbox name: 1 to 63 characters of a-z, 0-9 and '-', not starting with '-'", name), false
	}
	c.name = name
	return 0, true
}

func osAllows(stderr io.Writer) error {
	_, v := osVerdict()
	switch v.Level {
	case ospolicy.Block:
		return failure.With(failure.ErrOSUnsupported, errors.New(v.Message))
	case ospolicy.Warn:
		fmt.Fprintf(stderr, "oac-shim: %s\n", v.Message)
	}
	return nil
}

// agentOr returns the absolute path of agent, or oac-guest beside
// oac-shim.
func agentOr(agent string) (string, error) {
	if p := provider.AbsPath(agent); p != "" {
		return p, nil
	}
	p, err := defaultAgentPath()
	if err != nil {
		return "", failure.With(failure.ErrInvalidConfig, err)
	}
	return p, nil
}

// createCmd is oac-shim create: a record and the provider's kept state,
// nothing booted.
func createCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	c := &keptCmd{}
	fs := keptFlagSet("create", c, env)
	prov := fs.String("provider", "bwrap", "provider: "+strings.Join(provider.Names(), ", "))
	rootfs := fs.String("rootfs", "", "rootfs directory (default: the provider's default root)")
	agent := fs.String("agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	sandboxIO := fs.String("sandbox-io", "", "host binary to install as /usr/local/bin/oac-sandbox-io in the guest at every start")
	installs := installFlag{}
	fs.Var(installs, "install", "NAME=PATH: install a host binary as /usr/local/bin/NAME in the guest at every start (repeatable)")
	providers := provider.Declare(fs)
	asJSON := fs.Bool("json", false, "print the record made, one JSON object (schema/record.schema.json)")
	if code, ok := parseKept(fs, c, args, true); !ok {
		return code
	}
	if _, ok := providers[*prov]; !ok {
		fmt.Fprintf(stderr, "oac-shim create: unknown provider %q (have %s)\n", *prov, strings.Join(provider.Names(), ", "))
		return 2
	}
	for k, v := range installs {
		installs[k] = provider.AbsPath(v)
	}
	if err := osAllows(stderr); err != nil {
		return c.fail(err)
	}
	agentPath, err := agentOr(*agent)
	if err != nil {
		return c.fail(err)
	}
	rec, err := c.service().Create(context.Background(), kept.CreateRequest{
		Name: c.name, Provider: *prov, ProviderFlags: recordedProviderFlags(fs),
		Rootfs: provider.AbsPath(*rootfs), SandboxIO: provider.AbsPath(*sandboxIO), Install: installs,
		Agent: agentPath, Stderr: stderr,
	})
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, rec)
		return 0
	}
	fmt.Fprintf(stdout, "created %s (%s, image %s)\n", c.name, rec.Provider, rec.Image.Ref)
	return 0
}

// startCmd is oac-shim start: oac-shim run on a kept sandbox.
func startCmd(args []string, env cli.Env) int {
	stdin, stdout, stderr := env.Stdin, env.Stdout, env.Stderr
	f, code := parseRun("start", args, env)
	if f == nil {
		return code
	}
	c := &keptCmd{name: f.name, keepRoot: f.keepRoot, stdout: stdout, stderr: stderr}
	lease, err := c.service().Start(context.Background(), f.name, f.agentPath, stderr)
	if err != nil {
		return c.fail(err)
	}
	defer lease.Close()
	rec := lease.Record()
	f.prov, f.rootfs, f.sandboxIO = rec.Provider, rec.Flags.Rootfs, rec.Flags.SandboxIO
	f.installs = installFlag{}
	for k, v := range rec.Flags.Install {
		f.installs[k] = v
	}
	f.providers = map[string]func() provider.Provider{rec.Provider: func() provider.Provider { return lease.Provider }}
	return runShim(f, lease, stdin, stdout, stderr)
}

// resetCmd is oac-shim reset: the kept sandbox back to its image, name
// and record kept.
func resetCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	c := &keptCmd{}
	fs := keptFlagSet("reset", c, env)
	agent := fs.String("agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	asJSON := fs.Bool("json", false, "print the record, one JSON object (schema/record.schema.json)")
	if code, ok := parseKept(fs, c, args, true); !ok {
		return code
	}
	if err := osAllows(stderr); err != nil {
		return c.fail(err)
	}
	agentPath, err := agentOr(*agent)
	if err != nil {
		return c.fail(err)
	}
	rec, err := c.service().Reset(context.Background(), c.name, agentPath, stderr)
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, rec)
		return 0
	}
	fmt.Fprintf(stdout, "reset %s (%s, image %s)\n", c.name, rec.Provider, rec.Image.Ref)
	return 0
}

// destroyCmd is oac-shim destroy: every byte of the kept sandbox.
func destroyCmd(args []string, env cli.Env) int {
	stdout := env.Stdout
	c := &keptCmd{}
	fs := keptFlagSet("destroy", c, env)
	if code, ok := parseKept(fs, c, args, true); !ok {
		return code
	}
	if err := c.service().Destroy(context.Background(), c.name); err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(stdout, "destroyed %s\n", c.name)
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
