package helper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/guest/agent"
	"github.com/oac/sandbox-agent/guest/reaper"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// DefaultPolicyFile is the egress policy a helper reads when no --policy
// is given and the image has one.
const DefaultPolicyFile = "/etc/oac/egress-policy.json"

// DefaultName names the sandbox in the events when --name is not given.
const DefaultName = "sandbox"

// Config configures one helper run.
type Config struct {
	// Name is the events' sandbox name.
	Name string
	// Stdin carries the payload, then nothing until it closes.
	Stdin io.Reader
	// Events receives the events as JSON lines (stdout).
	Events io.Writer
	// Diag receives the runtime's diagnostics (stderr).
	Diag io.Writer
	Log  *slog.Logger
	// Reaper reaps the processes the agent starts (the helper is their
	// subreaper).
	Reaper       *reaper.Reaper
	AgentVersion string
	// PolicyFile, Allow and Upstreams are the egress policy, as oac-shim's
	// --policy, --allow and --upstream; PolicyFile "" reads
	// DefaultPolicyFile when it exists.
	PolicyFile       string
	Allow, Upstreams []string
	// Identity, when set, is the sandbox's own (--tenant, --environment,
	// --allocation): the payload's resource must name it. Nil takes the
	// payload's resource.
	Identity *bootstrap.Identity
	// ResolvConf is the guest's resolver configuration the broker keeps
	// (default /etc/resolv.conf).
	ResolvConf string
	// BootTimeout bounds start to ready (default sandbox.DefaultBootTimeout).
	BootTimeout time.Duration
}

// Run runs the sandbox the payload on cfg.Stdin describes until ctx ends
// (a signal), stdin closes, or the sandbox fails, and returns the exit
// status (oac-shim's: 0 stopped in order, else the failure's).
func Run(ctx context.Context, cfg Config) int {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	out := api.NewJSONLines(cfg.Events)
	sink := api.Func(func(e api.Event) {
		e.Mode = api.ModeHelper
		e.Attempt = 1
		out.Emit(e)
	})
	failed := func(err error) int {
		sink.Emit(api.Event{Time: time.Now().UTC(), Sandbox: cfg.Name, Event: api.KindState, State: api.StateFailed,
			Message: "nothing started: " + err.Error(), Code: failure.Code(err)})
		return failure.Exit(err)
	}
	boot, rest, err := ReadPayload(cfg.Stdin)
	if err != nil {
		return failed(fmt.Errorf("read the payload on stdin: %w", err))
	}
	withIdentity(boot, cfg.Identity)
	policyFile := cfg.PolicyFile
	if policyFile == "" {
		if _, err := os.Stat(DefaultPolicyFile); err == nil {
			policyFile = DefaultPolicyFile
		}
	}
	pol, err := egress.LoadPolicy(policyFile, cfg.Allow, cfg.Upstreams)
	if err != nil {
		return failed(failure.With(failure.ErrInvalidConfig, err))
	}
	exe, err := os.Executable()
	if err != nil {
		return failed(fmt.Errorf("find oac-guest: %w", err))
	}
	bcfg := egress.Config{Policy: pol, Log: cfg.Log.With("part", "egress")}
	r, servers, rerr := pinnedResolver(cfg.ResolvConf)
	if r != nil {
		bcfg.Resolver = r
		cfg.Log.Info("egress resolves with the guest's nameservers", "servers", servers)
	}
	if rerr != nil {
		cfg.Log.Warn("egress", "err", rerr)
		sink.Emit(api.Event{Time: time.Now().UTC(), Sandbox: cfg.Name, Event: api.KindState, State: api.StateStarting, Message: "egress: " + rerr.Error()})
	}
	broker := egress.New(bcfg)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if err := WatchRest(rest); err != nil {
			cancel(err)
			return
		}
		cancel(errors.New("stdin closed"))
	}()
	err = sandbox.Run(ctx, sandbox.Config{
		Name:        cfg.Name,
		Provider:    &inproc{agent: agent.Config{AgentVersion: cfg.AgentVersion, Reaper: cfg.Reaper, Log: cfg.Log, OwnNetNS: true}},
		AgentPath:   exe,
		Bootstrap:   boot,
		Events:      sink,
		Log:         cfg.Log,
		Diag:        cfg.Diag,
		Egress:      broker,
		BootTimeout: cfg.BootTimeout,
	})
	return failure.Exit(err)
}

// withIdentity gives a payload with sandbox_io its sandbox identity: the
// one given, which its resource must name, or else the resource's own.
func withIdentity(b *bootstrap.Bootstrap, id *bootstrap.Identity) {
	switch {
	case id != nil:
		b.Sandbox = id
	case b.SandboxIO != nil && b.SandboxIO.Bootstrap != nil:
		r := b.SandboxIO.Bootstrap.Resource
		b.Sandbox = &bootstrap.Identity{TenantID: r.TenantID, EnvironmentID: r.EnvironmentID, AllocationID: r.ID}
	}
}
