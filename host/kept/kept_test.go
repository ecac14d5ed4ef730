package kept

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
)

// keeper keeps sandboxes in files under Keep.Dir, and records the state
// the sandbox's record had when it was asked to discard.
type keeper struct {
	store persist.Store

	mu               sync.Mutex
	creates          int
	discardedInState []persist.State
}

func (*keeper) Name() string                { return "kept-test" }
func (*keeper) Check(context.Context) error { return nil }
func (*keeper) Capabilities() provider.Capabilities {
	return provider.Capabilities{Honours: provider.AllFeatures, Keeps: true}
}

func (k *keeper) Create(_ context.Context, spec provider.Spec) (provider.Instance, error) {
	k.mu.Lock()
	k.creates++
	k.mu.Unlock()
	if spec.Keep != nil {
		if err := os.WriteFile(filepath.Join(spec.Keep.Dir, "made"), nil, 0o600); err != nil {
			return nil, err
		}
	}
	return idle{}, nil
}

func (k *keeper) Discard(_ context.Context, name, dir string) error {
	rec, err := k.store.Load(name)
	k.mu.Lock()
	if err == nil {
		k.discardedInState = append(k.discardedInState, rec.State)
	} else {
		k.discardedInState = append(k.discardedInState, "")
	}
	k.mu.Unlock()
	return os.RemoveAll(filepath.Join(dir, "made"))
}

type idle struct{}

func (idle) Start(context.Context) error              { return errors.New("no runtime in unit tests") }
func (idle) Accept(context.Context) (net.Conn, error) { return nil, errors.New("never started") }
func (idle) Done() <-chan struct{}                    { return nil }
func (idle) Err() error                               { return nil }
func (idle) Kill() error                              { return nil }
func (idle) Destroy() error                           { return nil }

// service registers a keeper and returns it with a service on a file
// store in a temporary keep root, collecting what it says.
func service(t *testing.T) (*Service, *keeper, *[]string) {
	store := persist.NewFileStore(t.TempDir())
	k := &keeper{store: store}
	provider.Register(provider.Driver[struct{}]{Name: "kept-test", New: func(*struct{}) provider.Provider { return k }})
	t.Cleanup(func() { provider.Unregister("kept-test") })
	var said []string
	var mu sync.Mutex
	return New(store, func(m string) { mu.Lock(); said = append(said, m); mu.Unlock() }), k, &said
}

func create(t *testing.T, s *Service, name string) {
	t.Helper()
	_, err := s.Create(context.Background(), CreateRequest{Name: name, Provider: "kept-test", Agent: "/x", Stderr: io.Discard})
	require.NoError(t, err)
}

func TestDestroyMarksTheRecordBeforeTheProviderRemovesAnything(t *testing.T) {
	s, k, _ := service(t)
	create(t, s, "k1")
	require.NoError(t, s.Destroy(context.Background(), "k1"))
	assert.Equal(t, []persist.State{persist.StateDestroying}, k.discardedInState,
		"a destroy killed during the discard leaves a record the next command finishes")
	assert.False(t, s.Store.Exists("k1"))
}

func TestARecordLeftDestroyingIsFinishedByTheNextCommand(t *testing.T) {
	s, _, said := service(t)
	create(t, s, "k1")
	rec, err := s.Store.Load("k1")
	require.NoError(t, err)
	rec.State = persist.StateDestroying
	require.NoError(t, s.Store.Save(rec)) // as a destroy killed after it marked the record
	_, err = s.Start(context.Background(), "k1", "/x", io.Discard)
	assert.ErrorIs(t, err, persist.ErrNotFound)
	assert.Contains(t, *said, "discarded kept sandbox k1: a shim was killed while it was destroying it (state \"destroying\", no shim holds it); nothing of it is left")
	assert.False(t, s.Store.Exists("k1"))
}

func TestAThrowawayRunHoldsItsNameAgainstACreate(t *testing.T) {
	s, k, _ := service(t)
	res, err := s.Reserve(context.Background(), "t1")
	require.NoError(t, err)
	_, err = s.Create(context.Background(), CreateRequest{Name: "t1", Provider: "kept-test", Agent: "/x"})
	assert.ErrorIs(t, err, persist.ErrLocked, "create of a running throwaway sandbox's name")
	assert.Zero(t, k.creates, "nothing created")
	rep, err := s.List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Sandboxes, "a throwaway sandbox is not a kept one")
	res.Close()
	assert.False(t, s.Store.Exists("t1"), "the run's end removes its directory in the keep root")
	create(t, s, "t1")
}

func TestAThrowawayRunOfAKeptNameIsRefused(t *testing.T) {
	s, _, _ := service(t)
	create(t, s, "k1")
	_, err := s.Reserve(context.Background(), "k1")
	assert.ErrorIs(t, err, provider.ErrExists)
	assert.ErrorContains(t, err, "a kept sandbox named k1, nothing created")
	l, err := s.Store.Lock("k1")
	require.NoError(t, err, "the refusal dropped the lock")
	l.Unlock()
}

func TestAKilledRunsLeftoverIsRemovedAndSaidByTheNextCommand(t *testing.T) {
	s, _, said := service(t)
	l, err := s.Store.Lock("t1") // a run killed while it held its name
	require.NoError(t, err)
	l.Unlock()
	res, err := s.Reserve(context.Background(), "t1")
	require.NoError(t, err)
	defer res.Close()
	assert.Contains(t, *said, "removed what a killed oac-shim left of t1 (a directory with no record); nothing of it is left")
}

// unwritable is a keep root the user cannot write (a user with no home
// directory): every lock fails as the file store's mkdir does.
type unwritable struct{ persist.Store }

func (unwritable) Lock(name string) (persist.Unlocker, error) {
	return nil, fmt.Errorf("create /home/nobody/.local/state/oac: %w", &fs.PathError{Op: "mkdir", Path: "/home/nobody", Err: fs.ErrPermission})
}

func TestAKeepRootTheUserCannotWriteHoldsNoKeptSandbox(t *testing.T) {
	mem := persist.NewMem(t.TempDir())
	s := New(unwritable{mem}, nil)
	res, err := s.Reserve(context.Background(), "t1")
	require.NoError(t, err, "no kept sandbox can be there: the run goes on")
	res.Close()

	// A record that is there all the same (written by another user) is
	// still a kept sandbox's name.
	l, err := mem.Lock("k1")
	require.NoError(t, err)
	require.NoError(t, mem.Save(persist.Record{Schema: persist.SchemaVersion, Name: "k1", Provider: "kept-test", State: persist.StateCreated, Created: time.Now()}))
	l.Unlock()
	_, err = s.Reserve(context.Background(), "k1")
	assert.ErrorContains(t, err, "a kept sandbox named k1, nothing created")
}

func TestTheNextStartSaysWhenTheSandboxsShimWasKilledWhileItRan(t *testing.T) {
	s, _, _ := service(t)
	create(t, s, "k1")
	lease, err := s.Start(context.Background(), "k1", "/x", io.Discard)
	require.NoError(t, err)
	require.NoError(t, lease.Started())
	lease.Close() // the shim died: Ended never ran
	lease, err = s.Start(context.Background(), "k1", "/x", io.Discard)
	require.NoError(t, err)
	defer lease.Close()
	assert.Contains(t, lease.Notes, "kept sandbox k1 was running when its shim was killed (no shim holds it); what it kept is kept")
	_, err = os.Stat(filepath.Join(lease.Dir, "made"))
	assert.NoError(t, err, "what it kept is there")
}

func TestARunSweepsTheDirectoriesKilledRunsLeftUnderOtherNames(t *testing.T) {
	s, _, said := service(t)
	for _, n := range []string{"dead1", "dead2"} { // runs killed, names never used again
		l, err := s.Store.Lock(n)
		require.NoError(t, err)
		l.Unlock()
	}
	create(t, s, "k1")
	rec, err := s.Store.Load("k1")
	require.NoError(t, err)
	rec.State = persist.StateCreating // a create killed half way: its record waits for its own name
	require.NoError(t, s.Store.Save(rec))
	held, err := s.Store.Lock("busy") // a run of another name, going on
	require.NoError(t, err)
	defer held.Unlock()

	res, err := s.Reserve(context.Background(), "t1")
	require.NoError(t, err)
	defer res.Close()
	assert.False(t, s.Store.Exists("dead1"))
	assert.False(t, s.Store.Exists("dead2"))
	assert.Contains(t, *said, "removed what a killed oac-shim left of dead1 (a directory with no record); nothing of it is left")
	assert.True(t, s.Store.Exists("k1"), "a record is left to the commands on its name")
	assert.True(t, s.Store.Exists("busy"), "a name another shim holds is not touched")
}
