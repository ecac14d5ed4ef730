package shimcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/forward"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/host/volmount"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// A warm sandbox (oac-shim run --warm, docs/warm.md) boots with nothing of
// a tenant's: no bootstrap, no egress rule, no forward, no volume. The
// claim command hands it all of them at once; until then it is the same
// for everyone.

// tenantFlags are the run flags that carry a tenant's input: a warm
// sandbox takes them with its claim instead.
var tenantFlags = []string{"bootstrap", "bootstrap-format", "tenant", "environment", "allocation", "volume", "allow", "upstream", "policy", "forward", "password-stdin"}

// warmConflict says why the flags cannot go together, or "".
func warmConflict(fs *flag.FlagSet, f *runFlags) string {
	if !f.warm {
		if f.warmMaxAge != 0 {
			return "--warm-max-age goes with --warm"
		}
		return ""
	}
	if f.warmMaxAge < 0 {
		return "--warm-max-age must not be negative"
	}
	var given []string
	fs.Visit(func(fl *flag.Flag) {
		for _, t := range tenantFlags {
			if fl.Name == t {
				given = append(given, "--"+t)
			}
		}
	})
	if len(given) == 0 {
		return ""
	}
	sort.Strings(given)
	return fmt.Sprintf("--warm boots for nobody: %s belong to the tenant and come with the claim command (bootstrap, allow, upstreams, forwards, volumes)", strings.Join(given, ", "))
}

// warmBootstrap is what a warm run holds before its claim: the operator's
// --allow-loopback-link for Welcome, nothing of a tenant's.
func warmBootstrap(f *runFlags) *bootstrap.Bootstrap {
	b := &bootstrap.Bootstrap{Version: bootstrap.Version}
	if f.allowLoopback {
		b.Sandbox = &bootstrap.Identity{AllowLoopbackLink: true}
	}
	return b
}

// claimHandOver bounds the hand-over of a claim to the warm attempt, which
// takes it at once unless it is leaving the warm state.
const claimHandOver = 2 * time.Second

// errNotWarm refuses a claim (answer code conflict).
var errNotWarm = sandbox.ErrNotWarm

// claim makes the warm sandbox the tenant's: the claim's input is checked
// first (the bootstrap as --bootstrap is, the policy as set_policy's, the
// forwards as add_forward's), then its policy and forwards are put in
// force and its bootstrap handed to the warm attempt, which sends it to
// the guest. Anything refused before the attempt took the bootstrap is
// undone: the sandbox stays warm with nothing of the claim.
func (s *shim) claim(ctx context.Context, c api.Command) (any, error) {
	if !s.f.warm {
		return nil, api.Refuse(api.AnswerConflict, errNotWarm)
	}
	if s.stopping() {
		return nil, errStopping
	}
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.claimed {
		return nil, api.Refuse(api.AnswerConflict, fmt.Errorf("%w (it was claimed already)", errNotWarm))
	}
	st := s.ctrl.Status()
	if st.State != api.StateWarm {
		return nil, api.Refuse(api.AnswerConflict, fmt.Errorf("%w (it is %s: a claim waits for the warm state)", errNotWarm, st.State))
	}
	boot, err := decodeBootstrap(formatOAC, c.Bootstrap)
	if err != nil {
		return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: bootstrap: %w", err))
	}
	if boot.Sandbox != nil {
		id := *boot.Sandbox
		id.AllowLoopbackLink = s.f.allowLoopback // the operator's, never the tenant's
		boot.Sandbox = &id
	}
	if err := boot.Validate(); err != nil {
		return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: invalid bootstrap: %w", err))
	}
	pol, err := egress.ParsePolicy(c.Allow, c.Upstreams)
	if err != nil {
		return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: %w", err))
	}
	vols, err := s.claimVolumes(c.Volumes)
	if err != nil {
		return nil, err
	}
	specs := make([]forward.Spec, 0, len(c.Forwards))
	for _, fw := range c.Forwards {
		sp := forward.Spec{Listen: fw.Listen, GuestPort: fw.GuestPort}
		if err := sp.Validate(); err != nil {
			return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: forward %s: %w", fw.Listen, err))
		}
		specs = append(specs, sp)
	}

	old := s.broker.Policy()
	var opened []api.ForwardResult
	undo := func() {
		for _, r := range opened {
			_ = s.fwd.Remove(r.Listen)
		}
		s.broker.SetPolicy(old)
	}
	s.broker.SetPolicy(pol)
	for _, sp := range specs {
		info, err := s.fwd.Add(sp)
		if err != nil {
			undo()
			return nil, fmt.Errorf("claim: forward %s: %w (nothing of the claim is kept; the sandbox stays warm)", sp.Listen, err)
		}
		r := api.ForwardResult{ForwardInfo: info}
		if !sp.IsUnix() {
			r.URL = "http://" + info.Listen
		}
		opened = append(opened, r)
	}
	taken := make(chan error, 1)
	t := time.NewTimer(claimHandOver)
	defer t.Stop()
	select {
	case s.claims <- sandbox.Claim{Bootstrap: boot, Volumes: vols, Taken: taken}:
	case <-t.C:
		undo()
		return nil, api.Refuse(api.AnswerConflict, fmt.Errorf("%w (it left the warm state)", errNotWarm))
	case <-ctx.Done():
		undo()
		return nil, errStopping
	}
	if err := <-taken; err != nil {
		undo()
		if errors.Is(err, sandbox.ErrNotWarm) {
			return nil, api.Refuse(api.AnswerConflict, err)
		}
		return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: %w (the sandbox stays warm)", err))
	}
	// Claimed: later attempts (start, reset) boot this tenant's sandbox,
	// not a warm one.
	s.claimed = true
	s.mu.Lock()
	s.base.Bootstrap = boot
	s.base.Warm = nil
	s.mu.Unlock()
	s.policyEvent("egress policy of the claim in force")
	return api.ClaimResult{Attempt: st.Attempt, Forwards: nonNilForwards(opened), Egress: nonNil(pol.Describe())}, nil
}

func nonNilForwards(l []api.ForwardResult) []api.ForwardResult {
	if l == nil {
		return []api.ForwardResult{}
	}
	return l
}

// claimVolumes checks a claim's volumes as provider.CheckClaimVolumes
// does: a provider (or an unprivileged shim) that cannot mount them into
// its running guest refuses them as unsupported.
func (s *shim) claimVolumes(specs []api.VolumeSpec) ([]volmount.Volume, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, v := range specs {
		if _, dup := m[v.Guest]; dup {
			return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: volume %s given twice", v.Guest))
		}
		m[v.Guest] = v.Host
	}
	p := s.base.Provider
	err := provider.CheckClaimVolumes(p, m)
	if err == nil && !volmount.Supported() {
		err = fmt.Errorf("%w: oac-shim runs unprivileged: only a root shim can mount volumes into a running guest; boot the sandbox with --volume instead of from a warm pool", provider.ErrUnsupported)
	}
	if errors.Is(err, provider.ErrUnsupported) {
		return nil, api.Refuse(api.AnswerUnsupported, fmt.Errorf("claim: %w (the sandbox stays warm)", err))
	}
	if err != nil {
		return nil, api.Refuse(api.AnswerInvalidArgument, fmt.Errorf("claim: %w (the sandbox stays warm)", err))
	}
	vols := make([]volmount.Volume, 0, len(specs))
	for _, v := range specs {
		vols = append(vols, volmount.Volume{Guest: v.Guest, Host: v.Host})
	}
	return vols, nil
}
