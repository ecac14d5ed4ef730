//go:build kubernetes

package kubernetes

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/oac/sandbox-agent/host/provider"
)

const testDuration = 15 * time.Second

// leaseCluster is a fake API server whose Leases keep the real server's
// promise the lock relies on: a write that carries a resourceVersion
// other than the stored one is refused with a conflict, and so is a
// delete whose preconditions do not hold.
type leaseCluster struct {
	cs    *fake.Clientset
	clock *clocktesting.FakeClock

	mu sync.Mutex
	rv int
	// beforeUpdate, when set, runs before an update is applied (to let
	// another writer in between a read and a write).
	beforeUpdate func(*coordinationv1.Lease)
}

func newLeaseCluster() *leaseCluster {
	lc := &leaseCluster{cs: fake.NewSimpleClientset(), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	tr := lc.cs.Tracker()
	lc.cs.PrependReactor("*", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		lc.mu.Lock()
		hook := lc.beforeUpdate
		lc.mu.Unlock()
		if u, ok := a.(clienttesting.UpdateAction); ok && a.GetVerb() == "update" && hook != nil {
			hook(u.GetObject().(*coordinationv1.Lease))
		}
		lc.mu.Lock()
		defer lc.mu.Unlock()
		switch a.GetVerb() {
		case "create":
			a := a.(clienttesting.CreateAction)
			obj := a.GetObject().(*coordinationv1.Lease).DeepCopy()
			lc.rv++
			obj.ResourceVersion, obj.UID = strconv.Itoa(lc.rv), types.UID("uid-"+strconv.Itoa(lc.rv))
			return true, obj, tr.Create(gvr, obj, a.GetNamespace())
		case "update":
			a := a.(clienttesting.UpdateAction)
			obj := a.GetObject().(*coordinationv1.Lease).DeepCopy()
			cur, err := tr.Get(gvr, a.GetNamespace(), obj.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(*coordinationv1.Lease).ResourceVersion != obj.ResourceVersion {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), obj.Name, errors.New("the object has been modified"))
			}
			lc.rv++
			obj.ResourceVersion = strconv.Itoa(lc.rv)
			return true, obj, tr.Update(gvr, obj, a.GetNamespace())
		case "delete":
			a := a.(clienttesting.DeleteActionImpl)
			cur, err := tr.Get(gvr, a.GetNamespace(), a.GetName())
			if err != nil {
				return true, nil, err
			}
			l := cur.(*coordinationv1.Lease)
			if pre := a.DeleteOptions.Preconditions; pre != nil &&
				((pre.UID != nil && *pre.UID != l.UID) || (pre.ResourceVersion != nil && *pre.ResourceVersion != l.ResourceVersion)) {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, errors.New("precondition failed"))
			}
			return true, nil, tr.Delete(gvr, a.GetNamespace(), a.GetName())
		}
		return false, nil, nil
	})
	return lc
}

// store writes l as the next version, as another writer would.
func (lc *leaseCluster) store(t *testing.T, l *coordinationv1.Lease) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.rv++
	l = l.DeepCopy()
	l.ResourceVersion = strconv.Itoa(lc.rv)
	require.NoError(t, lc.cs.Tracker().Update(coordinationv1.SchemeGroupVersion.WithResource("leases"), l, "default"))
}

// shim is one shim process's Lease of sandbox name.
func (lc *leaseCluster) shim(name, holder, process string) *nameLease {
	return &nameLease{
		leases: lc.cs.CoordinationV1().Leases("default"), sandbox: name,
		holder: holder, identity: holder + "/" + process, duration: testDuration, clock: lc.clock,
	}
}

func (lc *leaseCluster) get(t *testing.T, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := lc.cs.CoordinationV1().Leases("default").Get(context.Background(), ObjectName(name), metav1.GetOptions{})
	require.NoError(t, err)
	return l
}

// acquiring is an Acquire running in the background.
type acquiring struct {
	done chan struct{}
	err  error
}

func acquire(ctx context.Context, l *nameLease) *acquiring {
	a := &acquiring{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.err = l.Acquire(ctx)
	}()
	return a
}

func (a *acquiring) ended() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// settle waits until waiters goroutines wait on the clock, or a has
// ended: the point where the fake clock may step again.
func (lc *leaseCluster) settle(t *testing.T, a *acquiring, waiters int) {
	t.Helper()
	require.Eventually(t, func() bool { return a.ended() || lc.clock.Waiters() >= waiters }, 10*time.Second, time.Millisecond)
}

func TestASecondShimIsRefusedWhileTheFirstRenewsTheLease(t *testing.T) {
	lc := newLeaseCluster()
	first := lc.shim("sb", "deploy", "pod-a")
	require.NoError(t, first.Acquire(context.Background()))
	defer first.Release()
	lease := lc.get(t, "sb")
	assert.Equal(t, "deploy/pod-a", *lease.Spec.HolderIdentity)
	assert.Equal(t, int32(15), *lease.Spec.LeaseDurationSeconds)
	assert.Equal(t, ManagedBy, lease.Labels[LabelManagedBy])
	assert.Equal(t, "sb", lease.Labels[LabelSandbox])
	assert.Equal(t, "deploy", lease.Annotations[AnnotationHolder])

	second := acquire(context.Background(), lc.shim("sb", "deploy", "pod-b"))
	lc.settle(t, second, 2) // the first's renewal, the second's look
	steps := 0
	for !second.ended() {
		require.Less(t, steps, 3, "the second shim saw a renewal within the Lease's duration")
		lc.clock.Step(first.poll())
		steps++
		lc.settle(t, second, 2)
	}
	require.ErrorIs(t, second.err, provider.ErrExists)
	assert.Contains(t, second.err.Error(), "sandbox sb is held by the shim deploy/pod-a (its Lease oac-sb was renewed while this shim waited)")
	assert.Equal(t, "deploy/pod-a", *lc.get(t, "sb").Spec.HolderIdentity, "the Lease is still the first's")
	assert.NoError(t, first.Lost())
}

func TestALeaseItsShimStoppedRenewingIsTakenOverAfterItsDuration(t *testing.T) {
	lc := newLeaseCluster()
	dead := lc.shim("sb", "deploy", "pod-a")
	// A shim killed right after it took the Lease: never renewed.
	require.NoError(t, dead.take(context.Background(), false))

	next := lc.shim("sb", "deploy", "pod-b")
	second := acquire(context.Background(), next)
	defer next.Release()
	lc.settle(t, second, 1)
	var waited time.Duration
	for !second.ended() {
		require.Less(t, waited, 2*testDuration)
		lc.clock.Step(next.poll())
		waited += next.poll()
		lc.settle(t, second, 1) // its next look
	}
	require.NoError(t, second.err)
	assert.Equal(t, testDuration, waited, "taken over once it went its duration unrenewed, not before")
	lease := lc.get(t, "sb")
	assert.Equal(t, "deploy/pod-b", *lease.Spec.HolderIdentity)
	assert.Equal(t, int32(1), *lease.Spec.LeaseTransitions)

	// Were the first shim alive after all, its next renewal finds it lost.
	err := dead.renewOnce()
	require.ErrorIs(t, err, errLost)
	assert.Contains(t, err.Error(), "was taken over by deploy/pod-b")
}

func TestAReleasedLeaseIsDeletedAndTheNameTakenAtOnce(t *testing.T) {
	lc := newLeaseCluster()
	first := lc.shim("sb", "deploy", "pod-a")
	require.NoError(t, first.Acquire(context.Background()))
	require.NoError(t, first.Release())
	_, err := lc.cs.CoordinationV1().Leases("default").Get(context.Background(), "oac-sb", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "released: deleted")

	second := lc.shim("sb", "deploy", "pod-b")
	require.NoError(t, second.Acquire(context.Background()), "no wait: nothing to wait for")
	defer second.Release()
	assert.Equal(t, "deploy/pod-b", *lc.get(t, "sb").Spec.HolderIdentity)
}

func TestAReleaseAfterATakeOverLeavesTheSuccessorsLease(t *testing.T) {
	lc := newLeaseCluster()
	old := lc.shim("sb", "deploy", "pod-a")
	require.NoError(t, old.take(context.Background(), false))
	lc.clock.Step(3 * testDuration)
	successor := lc.shim("sb", "deploy", "pod-b")
	require.NoError(t, successor.TakeIdle(context.Background()))

	require.NoError(t, old.Release(), "a lost Lease is not the old shim's to delete")
	assert.Equal(t, "deploy/pod-b", *lc.get(t, "sb").Spec.HolderIdentity)
}

func TestAnotherHoldersLeaseAndOneOacDidNotMakeAreRefusedAtOnce(t *testing.T) {
	lc := newLeaseCluster()
	other := lc.shim("sb", "other-host", "pid-1")
	require.NoError(t, other.take(context.Background(), false))
	err := lc.shim("sb", "deploy", "pod-a").Acquire(context.Background())
	require.ErrorIs(t, err, provider.ErrExists)
	assert.Contains(t, err.Error(), "sandbox sb is held by holder other-host (its Lease oac-sb)")

	_, err = lc.cs.CoordinationV1().Leases("default").Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "oac-foreign"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	err = lc.shim("foreign", "deploy", "pod-a").Acquire(context.Background())
	require.ErrorIs(t, err, provider.ErrExists)
	assert.Contains(t, err.Error(), "a Lease oac-foreign exists that oac did not make for sandbox foreign")
}

func TestOfTwoShimsTakingOneFreeLeaseOnlyOneGetsIt(t *testing.T) {
	lc := newLeaseCluster()
	first := lc.shim("sb", "deploy", "pod-a")
	require.NoError(t, first.take(context.Background(), false))
	require.NoError(t, first.Release()) // leaves nothing: make a free one
	free := ""
	_, err := lc.cs.CoordinationV1().Leases("default").Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: objectMeta("oac-sb", "", "sb", "deploy", false),
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &free},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// Between the second's read of the free Lease and its write, the
	// third takes it (written straight to the store: the fake clientset
	// takes no call from inside a call).
	var once sync.Once
	lc.beforeUpdate = func(l *coordinationv1.Lease) {
		if *l.Spec.HolderIdentity == "deploy/pod-b" {
			once.Do(func() { lc.store(t, lc.shim("sb", "deploy", "pod-c").fresh(l)) })
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	second := acquire(ctx, lc.shim("sb", "deploy", "pod-b"))
	lc.settle(t, second, 1)
	require.False(t, second.ended(), "the loser waits on the winner's Lease")
	assert.Equal(t, "deploy/pod-c", *lc.get(t, "sb").Spec.HolderIdentity)
	cancel()
	<-second.done
	require.ErrorIs(t, second.err, context.Canceled)
	assert.Contains(t, second.err.Error(), "waiting for the Lease oac-sb of sandbox sb (held by deploy/pod-c)")
}

func TestSweepTakesOnlyALeaseLongUnrenewed(t *testing.T) {
	lc := newLeaseCluster()
	held := lc.shim("sb", "deploy", "pod-a")
	require.NoError(t, held.take(context.Background(), false))

	lc.clock.Step(2 * testDuration)
	err := lc.shim("sb", "deploy", "sweeper").TakeIdle(context.Background())
	require.ErrorIs(t, err, provider.ErrExists, "twice its duration is not yet more than twice")
	assert.Contains(t, err.Error(), "is not idle")

	lc.clock.Step(time.Second)
	sweeper := lc.shim("sb", "deploy", "sweeper")
	require.NoError(t, sweeper.TakeIdle(context.Background()))
	assert.Equal(t, "deploy/sweeper", *lc.get(t, "sb").Spec.HolderIdentity)
	require.NoError(t, sweeper.Release())
	_, err = lc.cs.CoordinationV1().Leases("default").Get(context.Background(), "oac-sb", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
}

func TestAShimFindsItsLeaseLostWhenAnotherTookItAndStopsRenewing(t *testing.T) {
	lc := newLeaseCluster()
	lostc := make(chan error, 1)
	first := lc.shim("sb", "deploy", "pod-a")
	first.lost = func(err error) { lostc <- err }
	require.NoError(t, first.Acquire(context.Background()))
	// Another shim wrote its identity (as a take over after a partition
	// would).
	l := lc.get(t, "sb")
	other := "deploy/pod-b"
	l.Spec.HolderIdentity = &other
	_, err := lc.cs.CoordinationV1().Leases("default").Update(context.Background(), l, metav1.UpdateOptions{})
	require.NoError(t, err)

	require.Eventually(t, lc.clock.HasWaiters, 10*time.Second, time.Millisecond, "the renewals wait on the clock")
	lc.clock.Step(first.poll())
	err = <-lostc
	require.ErrorIs(t, err, errLost)
	assert.Equal(t, err, first.Lost())
	require.NoError(t, first.Release())
	assert.Equal(t, other, *lc.get(t, "sb").Spec.HolderIdentity, "a lost Lease is left to its holder")
}
