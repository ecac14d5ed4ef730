package shimcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
)

// keepingProvider keeps sandboxes the way a real one does, in files
// under Keep.Dir: every Create adds a line to Keep.Dir/made; an instance
// never starts (no runtime in unit tests).
type keepingProvider struct {
	mu         sync.Mutex
	specs      []provider.Spec
	discards   []string
	failCreate bool
}

func (*keepingProvider) Name() string                { return "keeping-test" }
func (*keepingProvider) Check(context.Context) error { return nil }

func (*keepingProvider) Capabilities() provider.Capabilities {
	return provider.Capabilities{Honours: provider.AllFeatures, Keeps: true}
}

func (p *keepingProvider) Create(_ context.Context, spec provider.Spec) (provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.specs = append(p.specs, spec)
	if spec.Keep != nil {
		f, err := os.OpenFile(filepath.Join(spec.Keep.Dir, "made"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		_, _ = f.WriteString("x\n")
		f.Close()
	}
	if p.failCreate {
		return nil, errors.New("the runtime refused")
	}
	return idleInstance{}, nil
}

func (p *keepingProvider) Discard(_ context.Context, name, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discards = append(p.discards, name)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
	return nil
}

func (p *keepingProvider) lastSpec() provider.Spec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.specs[len(p.specs)-1]
}

// idleInstance fails Start.
type idleInstance struct{}

func (idleInstance) Start(context.Context) error { return errors.New("no runtime in unit tests") }
func (idleInstance) Accept(context.Context) (net.Conn, error) {
	return nil, errors.New("never started")
}
func (idleInstance) Done() <-chan struct{} { return nil }
func (idleInstance) Err() error            { return nil }
func (idleInstance) Kill() error           { return nil }
func (idleInstance) Destroy() error        { return nil }

// keeping registers a keepingProvider as keeping-test and returns it with
// a keep root for the test.
func keeping(t *testing.T) (*keepingProvider, string) {
	p := &keepingProvider{}
	provider.Register(provider.Driver[struct{}]{Name: "keeping-test", New: func(*struct{}) provider.Provider { return p }})
	t.Cleanup(func() { provider.Unregister("keeping-test") })
	return p, t.TempDir()
}

func shimMain(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := Main(args, nil, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func listOf(t *testing.T, root string) api.ListReport {
	t.Helper()
	code, out, errOut := shimMain("list", "--json", "--keep-root", root)
	require.Zero(t, code, errOut)
	var rep api.ListReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	return rep
}

func create(t *testing.T, root, name string, extra ...string) {
	t.Helper()
	code, out, errOut := shimMain(append([]string{"create", "--provider", "keeping-test", "--name", name, "--agent", "/nonexistent/oac-guest", "--keep-root", root}, extra...)...)
	require.Zero(t, code, errOut)
	assert.Contains(t, out, "created "+name)
}

// left lists what is under the keep root's sandboxes directory.
func left(t *testing.T, root string) []string {
	var out []string
	_ = filepath.WalkDir(filepath.Join(root, "sandboxes"), func(p string, d os.DirEntry, err error) error {
		if err == nil && p != filepath.Join(root, "sandboxes") {
			out = append(out, strings.TrimPrefix(p, root))
		}
		return nil
	})
	return out
}

func TestCreateRecordsAndKeepsWithoutBooting(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "k1", "--install", "tool=/bin/true", "--sandbox-io", "/bin/sio")
	spec := p.lastSpec()
	require.NotNil(t, spec.Keep)
	assert.Equal(t, filepath.Join(root, "sandboxes", "k1", "state"), spec.Keep.Dir)
	assert.Equal(t, map[string]string{"tool": "/bin/true"}, spec.Install)
	rec, err := persist.NewFileStore(root).Load("k1")
	require.NoError(t, err)
	assert.Equal(t, persist.StateCreated, rec.State)
	assert.Equal(t, "keeping-test", rec.Provider)
	assert.Equal(t, "default root", rec.Image.Ref)
	assert.Equal(t, "/bin/sio", rec.Flags.SandboxIO)
	rep := listOf(t, root)
	require.Len(t, rep.Sandboxes, 1)
	e := rep.Sandboxes[0]
	assert.Equal(t, "k1", e.Name)
	assert.Equal(t, persist.StateCreated, e.State)
	assert.Positive(t, e.SizeBytes)
	assert.False(t, e.InUse)
	code, out, _ := shimMain("list", "--keep-root", root)
	require.Zero(t, code)
	assert.Regexp(t, `(?m)^k1\s+keeping-test\s+default root\s+created\s+\d`, out)

	code, _, errOut := shimMain("create", "--provider", "keeping-test", "--name", "k1", "--agent", "/x", "--keep-root", root)
	assert.NotZero(t, code)
	assert.Contains(t, errOut, "already exists")
}

func TestCreateRefusesAProviderThatCannotKeepAndLeavesNothing(t *testing.T) {
	registerFailing(t)
	root := t.TempDir()
	code, _, errOut := shimMain("create", "--provider", "failing-test", "--name", "k1", "--agent", "/x", "--keep-root", root)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code)
	assert.Contains(t, errOut, "the failing provider cannot keep a sandbox")
	assert.Empty(t, left(t, root))
}

func TestAFailedCreateRemovesWhatItMade(t *testing.T) {
	p, root := keeping(t)
	p.failCreate = true
	code, _, errOut := shimMain("create", "--provider", "keeping-test", "--name", "k1", "--agent", "/x", "--keep-root", root)
	assert.NotZero(t, code)
	assert.Contains(t, errOut, "the runtime refused")
	assert.Contains(t, errOut, "nothing of it is left")
	assert.Equal(t, []string{"k1"}, p.discards)
	assert.Empty(t, left(t, root))
}

// killedCreate leaves what a shim killed with SIGKILL during create
// leaves: a record in state creating, the provider's partial state, and
// a lock nobody holds.
func killedCreate(t *testing.T, root, name string) {
	s := persist.NewFileStore(root)
	l, err := s.Lock(name)
	require.NoError(t, err)
	require.NoError(t, s.Save(persist.Record{Schema: persist.SchemaVersion, Name: name, Provider: "keeping-test",
		Image: persist.Image{Ref: "default root"}, Created: time.Now(), State: persist.StateCreating}))
	require.NoError(t, os.WriteFile(filepath.Join(s.Dir(name), "partial"), []byte("half"), 0o600))
	l.Unlock()
}

func TestAKilledCreateIsDiscardedByTheNextCommandOnItsName(t *testing.T) {
	for _, tc := range []struct {
		cmd  []string
		code int // -1: any non-zero
	}{
		{[]string{"list"}, 0},
		{[]string{"create", "--provider", "keeping-test", "--agent", "/x"}, 0},
		{[]string{"start", "--agent", "/x"}, -1},
		{[]string{"reset", "--agent", "/x"}, -1},
		{[]string{"destroy"}, -1},
	} {
		t.Run(tc.cmd[0], func(t *testing.T) {
			p, root := keeping(t)
			killedCreate(t, root, "k1")
			args := append(append([]string(nil), tc.cmd...), "--keep-root", root)
			if tc.cmd[0] != "list" {
				args = append(args, "--name", "k1")
			}
			code, _, errOut := shimMain(args...)
			if tc.code < 0 {
				assert.NotZero(t, code, errOut)
			} else {
				assert.Equal(t, tc.code, code, errOut)
			}
			assert.Contains(t, errOut, "discarded kept sandbox k1: a shim was killed while it was creating it")
			assert.Contains(t, p.discards, "k1")
			if tc.cmd[0] == "create" {
				rec, err := persist.NewFileStore(root).Load("k1")
				require.NoError(t, err)
				assert.Equal(t, persist.StateCreated, rec.State, "created afresh")
				_, err = os.Stat(filepath.Join(root, "sandboxes", "k1", "state", "partial"))
				assert.ErrorIs(t, err, os.ErrNotExist)
				return
			}
			assert.Empty(t, left(t, root), "nothing of the half-created sandbox is left")
		})
	}
}

func TestStartRunsTheRecordedSandboxAndRecordsHowItEnded(t *testing.T) {
	p, root := keeping(t)
	rootfs := t.TempDir()
	create(t, root, "k1", "--rootfs", rootfs, "--install", "tool=/bin/true")
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, "new-file"), nil, 0o644))
	code, out, errOut := shimMain("start", "--name", "k1", "--agent", "/nonexistent/oac-guest", "--keep-root", root)
	assert.Equal(t, api.FailureOf(api.CodeRuntimeFailed).Exit, code, errOut)
	assert.Contains(t, errOut, "no runtime in unit tests")
	spec := p.lastSpec()
	require.NotNil(t, spec.Keep, "start creates with the kept state")
	assert.Equal(t, rootfs, spec.Rootfs, "from the record")
	assert.Equal(t, map[string]string{"tool": "/bin/true"}, spec.Install)
	assert.Contains(t, out, `"event":"kept"`)
	assert.Contains(t, out, "changed since kept sandbox k1 was created")
	assert.Contains(t, out, "until oac-shim reset")
	rec, err := persist.NewFileStore(root).Load("k1")
	require.NoError(t, err)
	assert.Equal(t, persist.StateFailed, rec.State)
	assert.Contains(t, rec.Message, "no runtime in unit tests")
	require.NotNil(t, rec.LastStarted)
	made, err := os.ReadFile(filepath.Join(spec.Keep.Dir, "made"))
	require.NoError(t, err)
	assert.Equal(t, "x\nx\n", string(made), "the state of create is still there at start")
}

func TestStartRefusesCreateFlagsAndUnknownNames(t *testing.T) {
	_, root := keeping(t)
	for _, flag := range [][]string{{"--rootfs", "/x"}, {"--provider", "bwrap"}, {"--install", "a=/b"}, {"--volume", "/home=/x"}, {"--sandbox-io", "/x"}} {
		code, _, errOut := shimMain(append([]string{"start", "--name", "k1", "--keep-root", root}, flag...)...)
		assert.Equal(t, 2, code, flag)
		assert.Contains(t, errOut, "fixed at create", flag)
	}
	code, _, errOut := shimMain("start", "--name", "nope", "--agent", "/x", "--keep-root", root)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code)
	assert.Contains(t, errOut, "oac-shim create it first")
	assert.Empty(t, left(t, root))
}

func TestResetDiscardsAndCreatesAfreshKeepingTheRecord(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "k1", "--install", "tool=/bin/true")
	s := persist.NewFileStore(root)
	before, err := s.Load("k1")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.Dir("k1"), "workspace-file"), nil, 0o600))
	code, out, errOut := shimMain("reset", "--name", "k1", "--agent", "/x", "--keep-root", root)
	require.Zero(t, code, errOut)
	assert.Contains(t, out, "reset k1")
	assert.Equal(t, []string{"k1"}, p.discards)
	_, err = os.Stat(filepath.Join(s.Dir("k1"), "workspace-file"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	made, err := os.ReadFile(filepath.Join(s.Dir("k1"), "made"))
	require.NoError(t, err)
	assert.Equal(t, "x\n", string(made), "one fresh create")
	after, err := s.Load("k1")
	require.NoError(t, err)
	assert.Equal(t, persist.StateCreated, after.State)
	assert.Equal(t, before.Flags, after.Flags)
	assert.False(t, after.Created.Before(before.Created))
	code, _, _ = shimMain("reset", "--name", "nope", "--agent", "/x", "--keep-root", root)
	assert.NotZero(t, code)
}

func TestDestroyRemovesEveryByte(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "k1")
	create(t, root, "k2")
	code, out, errOut := shimMain("destroy", "--name", "k1", "--keep-root", root)
	require.Zero(t, code, errOut)
	assert.Contains(t, out, "destroyed k1")
	assert.Equal(t, []string{"k1"}, p.discards)
	rep := listOf(t, root)
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, "k2", rep.Sandboxes[0].Name)
	code, _, errOut = shimMain("destroy", "--name", "k1", "--keep-root", root)
	assert.NotZero(t, code)
	assert.Contains(t, errOut, "no such kept sandbox")
	code, _, _ = shimMain("destroy", "--name", "k2", "--keep-root", root)
	require.Zero(t, code)
	assert.Empty(t, left(t, root))
}

func TestDestroyRemovesAnUnreadableRecord(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "k1")
	require.NoError(t, os.WriteFile(filepath.Join(root, "sandboxes", "k1", "record.json"), []byte(`{"schema":1`), 0o600))
	rep := listOf(t, root)
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, persist.StateFailed, rep.Sandboxes[0].State)
	assert.Contains(t, rep.Sandboxes[0].Message, "unreadable")
	code, _, errOut := shimMain("start", "--name", "k1", "--agent", "/x", "--keep-root", root)
	assert.NotZero(t, code)
	assert.Contains(t, errOut, "oac-shim destroy k1")
	code, _, errOut = shimMain("destroy", "--name", "k1", "--keep-root", root)
	require.Zero(t, code, errOut)
	assert.Contains(t, p.discards, "k1", "every keeping provider is asked")
	assert.Empty(t, left(t, root))
}

func TestCommandsOnASandboxInUseAreRefused(t *testing.T) {
	_, root := keeping(t)
	create(t, root, "k1")
	l, err := persist.NewFileStore(root).Lock("k1")
	require.NoError(t, err)
	defer l.Unlock()
	for _, cmd := range [][]string{{"destroy"}, {"reset", "--agent", "/x"}, {"start", "--agent", "/x"}} {
		code, _, errOut := shimMain(append(cmd, "--name", "k1", "--keep-root", root)...)
		assert.NotZero(t, code, cmd)
		assert.Contains(t, errOut, "in use by another oac-shim", cmd)
	}
	rep := listOf(t, root)
	require.Len(t, rep.Sandboxes, 1)
	assert.True(t, rep.Sandboxes[0].InUse)
}

func TestTheControlResetOfAKeptSandboxDiscardsItsState(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "unit")
	s, out := newTestShim(t)
	store := persist.NewFileStore(root)
	dir := store.Dir("unit")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "workspace-file"), nil, 0o600))
	lease, err := kept.Open(root, nil).Start(context.Background(), "unit", "/x", io.Discard)
	require.NoError(t, err)
	defer lease.Close()
	s.kept = lease
	s.base.Name, s.base.Provider, s.base.AgentPath = "unit", p, "/x"
	s.base.Keep = &provider.Keep{Dir: dir}
	ctx := context.Background()
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdStart})
	require.NoError(t, err)
	s.ctrl.Wait()
	_, err = os.Stat(filepath.Join(dir, "workspace-file"))
	require.NoError(t, err, "a start keeps")
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdReset})
	require.NoError(t, err)
	s.ctrl.Wait()
	assert.Equal(t, []string{"unit"}, p.discards)
	_, err = os.Stat(filepath.Join(dir, "workspace-file"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, out.String(), `"event":"kept"`)
	assert.Contains(t, out.String(), "reset: the kept state was discarded")
	rec, err := store.Load("unit")
	require.NoError(t, err)
	assert.Equal(t, persist.StateRunning, rec.State, "the shim goes on running it")
}

func TestRunRefusesTheNameOfAKeptSandboxBeforeCreatingAnything(t *testing.T) {
	p, root := keeping(t)
	create(t, root, "k1")
	require.Len(t, p.specs, 1)
	before := left(t, root)
	// The same provider, and another one (its throwaway state of that
	// name would be as much in the way).
	for _, prov := range []string{"keeping-test", "bwrap"} {
		code, out, errOut := shimMain("run", "--provider", prov, "--name", "k1", "--agent", "/nonexistent/oac-guest", "--keep-root", root)
		assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code, prov)
		assert.Contains(t, errOut, "sandbox already exists: a kept sandbox named k1, nothing created", prov)
		assert.Contains(t, errOut, "oac-shim start k1 runs it", prov)
		var e api.Event
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &e), "one event: %s", out)
		assert.Equal(t, api.StateFailed, e.State)
		assert.Equal(t, api.CodeInvalidConfig, e.Code)
	}
	assert.Len(t, p.specs, 1, "run created nothing")
	assert.Equal(t, before, left(t, root), "the kept sandbox is untouched")
	assert.Equal(t, persist.StateCreated, listOf(t, root).Sandboxes[0].State)

	// An unreadable record is still a kept sandbox's name.
	require.NoError(t, os.WriteFile(filepath.Join(root, "sandboxes", "k1", "record.json"), []byte(`{"schema":1`), 0o600))
	code, _, errOut := shimMain("run", "--provider", "keeping-test", "--name", "k1", "--agent", "/nonexistent/oac-guest", "--keep-root", root)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code)
	assert.Contains(t, errOut, "a kept sandbox named k1, nothing created")
	assert.Len(t, p.specs, 1)

	// Another name runs (and fails at Start: no runtime in unit tests).
	code, _, errOut = shimMain("run", "--provider", "keeping-test", "--name", "k2", "--agent", "/nonexistent/oac-guest", "--keep-root", root)
	assert.NotEqual(t, api.FailureOf(api.CodeInvalidConfig).Exit, code, errOut)
	assert.NotContains(t, errOut, "kept sandbox")
	assert.Len(t, p.specs, 2, "a throwaway sandbox of another name is created")
	assert.Nil(t, p.lastSpec().Keep)
}
