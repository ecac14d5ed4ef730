//go:build kubernetes

package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"

	"github.com/oac/sandbox-agent/host/provider"
)

// leaseDuration is --k8s-lease-duration, or its default.
func (p *Provider) leaseDuration() time.Duration {
	if p.LeaseDuration > 0 {
		return p.LeaseDuration
	}
	return DefaultLeaseDuration
}

// lease is the Lease of sandbox name for this process.
func (p *Provider) lease(c *cluster, name string) *nameLease {
	holder := p.holder()
	return &nameLease{
		leases: c.cs.CoordinationV1().Leases(c.namespace), sandbox: name,
		holder: holder, identity: processIdentity(holder), duration: p.leaseDuration(), clock: clock.RealClock{},
	}
}

// claimName takes the sandbox's Lease for the instance (Create's lock on
// the name, where other providers claim a state directory): Destroy
// releases it, after everything else. The returned Lease says whether it
// was lost on the way (see unlessLost).
func (in *Instance) claimName(ctx context.Context) (*nameLease, error) {
	l := in.p.lease(in.c, in.spec.Name)
	l.lost = func(err error) {
		in.logf("%v: this shim no longer acts on the sandbox (its successor removes its Pod)", err)
	}
	if err := l.Acquire(ctx); err != nil {
		return nil, err
	}
	in.Own(l)
	return l, nil
}

// unlessLost runs remove only while this process holds the Lease: once
// another shim took the sandbox over, its objects of the name are that
// shim's (a Pod of the same name, a policy the new Pod needs).
func unlessLost(l *nameLease, remove func() error) func() error {
	return func() error {
		if err := l.Lost(); err != nil {
			return nil
		}
		return remove()
	}
}

// idle takes the Lease of another sandbox of this holder for sweep, when
// no shim can be acting on it (see nameLease.TakeIdle); its Release
// deletes the Lease. It returns an error for a sandbox to leave alone.
func (p *Provider) idle(ctx context.Context, c *cluster, name string) (*nameLease, error) {
	l := p.lease(c, name)
	if err := l.TakeIdle(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// withName runs do holding the sandbox's Lease (Discard's lock on the
// name): a sandbox of the name that a live shim runs is refused with
// provider.ErrExists and nothing of it is touched.
func (p *Provider) withName(ctx context.Context, c *cluster, name string, do func() error) error {
	l := p.lease(c, name)
	if err := l.Acquire(ctx); err != nil {
		if errors.Is(err, provider.ErrExists) {
			return fmt.Errorf("discard sandbox %s: %w (stop the sandbox of that name first)", name, err)
		}
		return err
	}
	return errors.Join(do(), l.Release())
}
