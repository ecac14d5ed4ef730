//go:build kubernetes

package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	"github.com/oac/sandbox-agent/host/provider"
)

// DefaultLeaseDuration is how long a sandbox's Lease stays a live shim's
// without a renewal (--k8s-lease-duration): a shim renews it every third
// of that, and a shim of the same holder takes over a Lease it saw go
// that long unrenewed.
const DefaultLeaseDuration = 15 * time.Second

// nameLease is the cluster-wide lock on one sandbox's name: the
// coordination.k8s.io Lease oac-NAME, labelled like the sandbox's other
// objects and annotated with its holder, whose holderIdentity names the
// one shim process that acts on the sandbox (HOLDER/HOST/PID/RANDOM). It
// replaces the state directory's flock, which a shim Pod loses with its
// file system on every restart, and which two replicas on two nodes never
// share.
//
// Exclusive because every change is an update with the resourceVersion
// read: of two shims that take one Lease at once, one gets a conflict.
// A Lease held by another identity is taken over only after this process
// saw it go one lease duration without a renewal, by its own clock (as
// client-go's leader election does), so clocks that disagree cannot make
// a live shim's Lease look dead.
type nameLease struct {
	leases   coordinationclient.LeaseInterface
	sandbox  string
	holder   string // the annotation every object of the holder carries
	identity string // this process
	duration time.Duration
	clock    clock.Clock
	// lost is called once when another identity is found in the Lease
	// while this one held it.
	lost func(error)

	mu    sync.Mutex
	held  *coordinationv1.Lease
	gone  error // why the Lease is no longer this process's
	stop  chan struct{}
	ended chan struct{}
}

// processIdentity names this process in the Lease: the holder, the host
// (a Pod's name), the pid and a random part (a pid is reused).
func processIdentity(holder string) string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%s/%d/%s", holder, host, os.Getpid(), hex.EncodeToString(b[:]))
}

func leaseSeconds(d time.Duration) int32 {
	s := int32((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// leaseOf returns the Lease's duration as written in it, or fallback.
func leaseOf(l *coordinationv1.Lease, fallback time.Duration) time.Duration {
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return fallback
}

func (l *nameLease) objectName() string { return ObjectName(l.sandbox) }

// fresh is a Lease of this process, as made or taken over now.
func (l *nameLease) fresh(base *coordinationv1.Lease) *coordinationv1.Lease {
	now := metav1.NewMicroTime(l.clock.Now())
	out := &coordinationv1.Lease{}
	if base != nil {
		out = base.DeepCopy()
	} else {
		out.ObjectMeta = objectMeta(l.objectName(), "", l.sandbox, l.holder, false)
		delete(out.Labels, LabelKept)
	}
	secs := leaseSeconds(l.duration)
	out.Spec.HolderIdentity = &l.identity
	out.Spec.LeaseDurationSeconds = &secs
	out.Spec.AcquireTime = &now
	out.Spec.RenewTime = &now
	if base != nil {
		n := int32(1)
		if out.Spec.LeaseTransitions != nil {
			n = *out.Spec.LeaseTransitions + 1
		}
		out.Spec.LeaseTransitions = &n
	}
	return out
}

// refuse says which live shim holds the name.
func (l *nameLease) refuse(have *coordinationv1.Lease, why string) error {
	return fmt.Errorf("%w: kubernetes: sandbox %s is held by the shim %s (its Lease %s %s): stop it there, or use another name",
		provider.ErrExists, l.sandbox, holderOf(have), l.objectName(), why)
}

func holderOf(have *coordinationv1.Lease) string {
	if have.Spec.HolderIdentity == nil {
		return ""
	}
	return *have.Spec.HolderIdentity
}

// check refuses a Lease this provider did not make for the sandbox, or
// another holder's (whose Pods this holder never touches either).
func (l *nameLease) check(have *coordinationv1.Lease) error {
	switch {
	case !owned(have.ObjectMeta, l.sandbox):
		return fmt.Errorf("%w: kubernetes: a Lease %s exists that oac did not make for sandbox %s: remove or rename it", provider.ErrExists, have.Name, l.sandbox)
	case have.Annotations[AnnotationHolder] != l.holder:
		return fmt.Errorf("%w: kubernetes: sandbox %s is held by holder %s (its Lease %s): stop it there, or use another name",
			provider.ErrExists, l.sandbox, have.Annotations[AnnotationHolder], have.Name)
	}
	return nil
}

// Acquire takes the Lease: it makes it, takes it when free (released, or
// left by a shim of this holder that has not renewed it for its
// duration) and refuses it, with provider.ErrExists, when another shim
// renews it while Acquire watches or when another holder's. Waiting on a
// held Lease lasts at most its duration. Once held, the Lease is renewed
// until Release.
func (l *nameLease) Acquire(ctx context.Context) error {
	if err := l.take(ctx, false); err != nil {
		return err
	}
	l.stop, l.ended = make(chan struct{}), make(chan struct{})
	go l.renew()
	return nil
}

// TakeIdle takes the Lease only if nothing is to wait for: missing, free,
// or not renewed for twice its duration by this host's clock (what sweep
// may remove without waiting on every sandbox it sees). It is not renewed:
// Release it soon.
func (l *nameLease) TakeIdle(ctx context.Context) error {
	return l.take(ctx, true)
}

func (l *nameLease) take(ctx context.Context, idle bool) error {
	type seen struct {
		rv string
		at time.Time
	}
	var watched *seen
	for {
		have, err := l.leases.Get(ctx, l.objectName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			made, err := l.leases.Create(ctx, l.fresh(nil), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // another shim made it first: look at it
			}
			if err != nil {
				return l.apiErr("make the sandbox's Lease", err)
			}
			l.setHeld(made)
			return nil
		case err != nil:
			return l.apiErr("look for the sandbox's Lease", err)
		}
		if err := l.check(have); err != nil {
			return err
		}
		free := holderOf(have) == ""
		if !free && idle {
			// By this host's clock against the holder's: twice the
			// duration leaves room for clocks that disagree.
			free = have.Spec.RenewTime != nil && l.clock.Since(have.Spec.RenewTime.Time) > 2*leaseOf(have, l.duration)
			if !free {
				return l.refuse(have, "is not idle")
			}
		}
		if !free && watched != nil && watched.rv != have.ResourceVersion {
			return l.refuse(have, "was renewed while this shim waited")
		}
		if !free && watched != nil && l.clock.Since(watched.at) >= leaseOf(have, l.duration) {
			free = true // not renewed for its duration: its shim is dead
		}
		if free {
			taken, err := l.leases.Update(ctx, l.fresh(have), metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				watched = nil
				continue // changed since read: look again
			}
			if err != nil {
				return l.apiErr("take over the sandbox's Lease", err)
			}
			l.setHeld(taken)
			return nil
		}
		if watched == nil {
			watched = &seen{rv: have.ResourceVersion, at: l.clock.Now()}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: waiting for the Lease %s of sandbox %s (held by %s): %w", have.Name, l.sandbox, holderOf(have), ctx.Err())
		case <-l.clock.After(l.poll()):
		}
	}
}

// poll is how often a held Lease is looked at and renewed: three times
// a duration.
func (l *nameLease) poll() time.Duration { return l.duration / 3 }

func (l *nameLease) setHeld(lease *coordinationv1.Lease) {
	l.mu.Lock()
	l.held = lease
	l.mu.Unlock()
}

// renew keeps the Lease this process's until Release; a renewal that
// fails is tried again at the next tick, and one that finds another
// identity in the Lease ends the renewals and reports the loss.
func (l *nameLease) renew() {
	defer close(l.ended)
	for {
		select {
		case <-l.stop:
			return
		case <-l.clock.After(l.poll()):
		}
		if err := l.renewOnce(); err != nil {
			l.mu.Lock()
			l.gone = err
			l.mu.Unlock()
			if l.lost != nil {
				l.lost(err)
			}
			return
		}
	}
}

// errLost is a Lease another identity now holds.
var errLost = errors.New("lost")

// renewOnce writes a new renewTime; it returns an error only when the
// Lease is no longer this process's (a call the server does not answer
// is tried again later).
func (l *nameLease) renewOnce() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.duration)
	defer cancel()
	l.mu.Lock()
	next := l.held.DeepCopy()
	l.mu.Unlock()
	now := metav1.NewMicroTime(l.clock.Now())
	next.Spec.RenewTime = &now
	done, err := l.leases.Update(ctx, next, metav1.UpdateOptions{})
	if err == nil {
		l.setHeld(done)
		return nil
	}
	if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return nil
	}
	have, gerr := l.leases.Get(ctx, l.objectName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(gerr):
		return fmt.Errorf("%w: kubernetes: the Lease %s of sandbox %s was deleted while this shim held it", errLost, l.objectName(), l.sandbox)
	case gerr != nil:
		return nil
	case holderOf(have) != l.identity:
		return fmt.Errorf("%w: kubernetes: the Lease %s of sandbox %s was taken over by %s (this shim did not renew it within %s)", errLost, have.Name, l.sandbox, holderOf(have), leaseOf(have, l.duration))
	}
	l.setHeld(have) // someone else's change to our Lease: renew on it next
	return nil
}

// Lost is why the Lease is no longer this process's, or nil.
func (l *nameLease) Lost() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gone
}

// Release stops the renewals and deletes the Lease if it is still this
// process's (the preconditions: its uid and the resourceVersion last
// written). It implements io.Closer for provider.Process.Own.
func (l *nameLease) Release() error {
	if l.stop != nil {
		close(l.stop)
		<-l.ended
		l.stop = nil
	}
	l.mu.Lock()
	held, gone := l.held, l.gone
	l.held = nil
	l.mu.Unlock()
	if held == nil || gone != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), quickTimeout)
	defer cancel()
	err := l.leases.Delete(ctx, held.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &held.UID, ResourceVersion: &held.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return l.apiErr("release the sandbox's Lease", err)
	}
	return nil
}

// Close implements io.Closer.
func (l *nameLease) Close() error { return l.Release() }

func (l *nameLease) apiErr(what string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: kubernetes: %s: %v (grant the Role in docs/kubernetes.md: it needs leases in coordination.k8s.io)", provider.ErrUnavailable, what, err)
	}
	return fmt.Errorf("kubernetes: %s %s: %w", what, l.objectName(), err)
}
