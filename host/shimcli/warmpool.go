package shimcli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
)

// oac-shim warm-pool: the objects a cluster keeps warm sandboxes of a
// provider with (agent-sandbox's SandboxTemplate and SandboxWarmPool for
// kubernetes), written from the provider's own flags, so the Pods a pool
// keeps are the Pods the provider would make.

const warmPoolHelp = `Prints, as YAML to apply in the sandboxes' namespace, the SandboxTemplate of
the provider's Pod for these provider flags and a SandboxWarmPool that keeps
--replicas of it warm (agent-sandbox, sigs.k8s.io/agent-sandbox v1.0.1). Each
Pod's agent waits for a session and knows nothing of a sandbox; oac-shim run
--k8s-api agent-sandbox --k8s-warm-pool POOL claims one and sends the bootstrap.
The template's NetworkPolicy denies its Pods all traffic. Pods use user
namespaces (hostUsers: false) only with --k8s-user-namespaces require.
`

// poolManifester is a provider a cluster can keep warm sandboxes of.
type poolManifester interface {
	WarmPoolManifest(template, pool string, replicas int32) ([]byte, error)
}

func warmPoolCmd(args []string, env cli.Env) int {
	fs := cli.FlagSet("oac-shim warm-pool")
	prov := fs.String("provider", "kubernetes", "provider: kubernetes (the one a cluster keeps warm Pods of)")
	template := fs.String("template", "oac", "the SandboxTemplate's name")
	pool := fs.String("pool", "oac-warm", "the SandboxWarmPool's name (--k8s-warm-pool)")
	replicas := fs.Int("replicas", 2, "warm sandboxes the pool keeps")
	providers := provider.Declare(fs)
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) > 0 {
		return cli.Usagef(fs, env.Stderr, "takes no arguments, not %q", args)
	}
	ctor, ok := providers[*prov]
	if !ok {
		return cli.Usagef(fs, env.Stderr, "unknown provider %q (have %s)", *prov, strings.Join(provider.Names(), ", "))
	}
	if !provider.ValidName(*template) || !provider.ValidName(*pool) {
		return cli.Usagef(fs, env.Stderr, "--template and --pool are names (a-z, 0-9, '-')")
	}
	if *replicas < 0 || *replicas > 1000 {
		return cli.Usagef(fs, env.Stderr, "--replicas %d: want 0 to 1000", *replicas)
	}
	p := ctor()
	m, ok := p.(poolManifester)
	if !ok {
		msg := fmt.Sprintf("the %s provider has no warm pool a cluster keeps: oac-shim run --warm keeps a warm sandbox of any provider (docs/warm.md)", *prov)
		if err := p.Check(context.Background()); errors.Is(err, provider.ErrUnavailable) {
			msg = err.Error()
		}
		fmt.Fprintln(env.Stderr, "oac-shim warm-pool: "+msg)
		return 1
	}
	out, err := m.WarmPoolManifest(*template, *pool, int32(*replicas))
	if err != nil {
		fmt.Fprintln(env.Stderr, "oac-shim warm-pool: "+err.Error())
		return 2
	}
	_, _ = env.Stdout.Write(out)
	return 0
}
