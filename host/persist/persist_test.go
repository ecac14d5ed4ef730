//go:build unix

package persist

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func record(name string) Record {
	return Record{
		Schema: SchemaVersion, Name: name, Provider: "bwrap",
		Image:   Image{Ref: "/images/root", Digest: "sha256:00"},
		Flags:   Flags{Rootfs: "/images/root", SandboxIO: "/bin/sio", Install: map[string]string{"d": "/bin/d"}, Provider: []string{"--runtime=crun"}},
		Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), State: StateCreated,
	}
}

// stores runs f against both Store implementations.
func stores(t *testing.T, f func(t *testing.T, s Store)) {
	t.Run("file", func(t *testing.T) { f(t, NewFileStore(t.TempDir())) })
	t.Run("mem", func(t *testing.T) { f(t, NewMem(t.TempDir())) })
}

func TestStoreSavesLoadsListsAndRemoves(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		_, err := s.Load("a")
		require.ErrorIs(t, err, ErrNotFound)
		l, err := s.Lock("a")
		require.NoError(t, err)
		r := record("a")
		require.NoError(t, s.Save(r))
		got, err := s.Load("a")
		require.NoError(t, err)
		assert.Equal(t, r, got)
		now := time.Now().UTC().Truncate(time.Second)
		r.State, r.LastStarted = StateRunning, &now
		require.NoError(t, s.Save(r))
		got, err = s.Load("a")
		require.NoError(t, err)
		assert.Equal(t, StateRunning, got.State)
		assert.True(t, now.Equal(*got.LastStarted))
		names, err := s.List()
		require.NoError(t, err)
		assert.Equal(t, []string{"a"}, names)
		require.NoError(t, s.Remove("a"))
		l.Unlock()
		_, err = s.Load("a")
		require.ErrorIs(t, err, ErrNotFound)
		names, err = s.List()
		require.NoError(t, err)
		assert.Empty(t, names)
		require.NoError(t, s.Remove("a"), "removing what is not there")
	})
}

func TestStoreLockIsExclusivePerName(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		a, err := s.Lock("a")
		require.NoError(t, err)
		assert.True(t, s.Held("a"))
		_, err = s.Lock("a")
		require.ErrorIs(t, err, ErrLocked)
		b, err := s.Lock("b")
		require.NoError(t, err, "another name is independent")
		b.Unlock()
		a.Unlock()
		a.Unlock()
		assert.False(t, s.Held("a"))
		a, err = s.Lock("a")
		require.NoError(t, err)
		a.Unlock()
	})
}

func TestStoreRefusesInvalidNamesAndRecords(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		for _, n := range []string{"", "../x", "A", "-a", strings.Repeat("a", 64)} {
			_, err := s.Lock(n)
			assert.Error(t, err, n)
		}
		for _, mutate := range []func(*Record){
			func(r *Record) { r.Schema = 2 },
			func(r *Record) { r.State = "dreaming" },
			func(r *Record) { r.Provider = "" },
			func(r *Record) { r.Created = time.Time{} },
			func(r *Record) { r.Name = "Bad" },
		} {
			r := record("a")
			mutate(&r)
			assert.ErrorIs(t, s.Save(r), ErrCorrupt)
		}
	})
}

func TestDecodeIsStrict(t *testing.T) {
	good, err := Encode(record("a"))
	require.NoError(t, err)
	_, err = Decode(good, "a")
	require.NoError(t, err)
	_, err = Decode(good, "b")
	assert.ErrorIs(t, err, ErrCorrupt, "a record under another name")
	s := string(good)
	for name, doc := range map[string]string{
		"unknown key":    strings.Replace(s, `"name"`, `"extra": 1, "name"`, 1),
		"repeated key":   strings.Replace(s, `"name": "a"`, `"name": "a", "name": "a"`, 1),
		"case variant":   strings.Replace(s, `"provider"`, `"Provider"`, 1),
		"missing state":  strings.Replace(s, `"state": "created"`, `"message": "x"`, 1),
		"trailing data":  s + "{}",
		"truncated":      s[:len(s)/2],
		"empty":          "",
		"wrong type":     strings.Replace(s, `"schema": 1`, `"schema": "1"`, 1),
		"newer schema":   strings.Replace(s, `"schema": 1`, `"schema": 9`, 1),
		"too large":      s + strings.Repeat(" ", MaxRecordSize),
		"unknown state":  strings.Replace(s, `"created"`, `"dreaming"`, 1),
		"not an object":  `[]`,
		"nested unknown": strings.Replace(s, `"ref"`, `"size": 1, "ref"`, 1),
	} {
		_, err := Decode([]byte(doc), "a")
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
}

func TestATornSaveNeverYieldsACorruptRecord(t *testing.T) {
	s := NewFileStore(t.TempDir())
	l, err := s.Lock("a")
	require.NoError(t, err)
	defer l.Unlock()
	old := record("a")
	require.NoError(t, s.Save(old))
	dir := filepath.Join(s.Root, "sandboxes", "a")
	next, err := Encode(func() Record { r := old; r.State = StateRunning; return r }())
	require.NoError(t, err)
	// What a shim killed at each point of a Save leaves: a temporary file
	// empty, cut short or complete but not renamed.
	for i, n := range []int{0, 1, len(next) / 2, len(next) - 1, len(next)} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, tempPrefix+string(rune('a'+i))+".tmp"), next[:n], 0o600))
		got, err := s.Load("a")
		require.NoError(t, err, "cut at %d", n)
		assert.Equal(t, old, got, "cut at %d: the record is the old one", n)
	}
	names, err := s.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, names)
	// The next Save replaces the record and sweeps the leftovers.
	r := old
	r.State = StateStopped
	require.NoError(t, s.Save(r))
	got, err := s.Load("a")
	require.NoError(t, err)
	assert.Equal(t, StateStopped, got.State)
	left, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	assert.Empty(t, left)
}

func TestAFileStoreRecordCutShortIsReportedNotUsed(t *testing.T) {
	// Not something Save can leave (it renames whole files), but a disk
	// can: the record is refused with ErrCorrupt and how to remove it.
	s := NewFileStore(t.TempDir())
	l, err := s.Lock("a")
	require.NoError(t, err)
	defer l.Unlock()
	data, err := Encode(record("a"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, "sandboxes", "a", recordName), data[:10], 0o600))
	_, err = s.Load("a")
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "oac-shim destroy a")
}

func TestFileStoreLayoutAndRemoveTakesEveryByte(t *testing.T) {
	s := NewFileStore(t.TempDir())
	l, err := s.Lock("a")
	require.NoError(t, err)
	st, err := os.Stat(s.Dir("a"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	require.NoError(t, s.Save(record("a")))
	st, err = os.Stat(filepath.Join(s.Root, "sandboxes", "a", recordName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	// A guest can leave a directory nobody may enter.
	deep := filepath.Join(s.Dir("a"), "home", "x")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(deep, "f"), []byte("data"), 0o600))
	require.NoError(t, os.Chmod(deep, 0o000))
	assert.Positive(t, DiskUsage(s.Dir("a")))
	require.NoError(t, s.Remove("a"))
	l.Unlock()
	ents, err := os.ReadDir(filepath.Join(s.Root, "sandboxes"))
	require.NoError(t, err)
	assert.Empty(t, ents)
}

func TestFileStoreLockDiesWithItsProcess(t *testing.T) {
	// A lock held by another process (flock on its own open file) is
	// seen as held, and free once that process is killed.
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) is not installed: apt-get install util-linux")
	}
	s := NewFileStore(t.TempDir())
	l, err := s.Lock("a")
	require.NoError(t, err)
	l.Unlock()
	cmd := exec.Command(flock, "--exclusive", filepath.Join(s.Root, "sandboxes", "a", lockName), "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	defer kill()
	require.Eventually(t, func() bool { return s.Held("a") }, 5*time.Second, 10*time.Millisecond)
	_, err = s.Lock("a")
	require.ErrorIs(t, err, ErrLocked)
	kill() // flock and sleep, which inherited the descriptor
	_, _ = cmd.Process.Wait()
	require.Eventually(t, func() bool { return !s.Held("a") }, 10*time.Second, 10*time.Millisecond)
	l, err = s.Lock("a")
	require.NoError(t, err)
	l.Unlock()
}

func TestDigest(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "img")
	require.NoError(t, os.WriteFile(f, []byte("one"), 0o644))
	d1, err := Digest(f)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(d1, "sha256:"))
	require.NoError(t, os.WriteFile(f, []byte("two"), 0o644))
	d2, err := Digest(f)
	require.NoError(t, err)
	assert.NotEqual(t, d1, d2)
	t1, err := Digest(dir)
	require.NoError(t, err)
	t2, err := Digest(dir)
	require.NoError(t, err)
	assert.Equal(t, t1, t2, "stable")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "new"), nil, 0o644))
	t3, err := Digest(dir)
	require.NoError(t, err)
	assert.NotEqual(t, t1, t3)
	_, err = Digest(filepath.Join(dir, "missing"))
	assert.Error(t, err)
	d, err := Digest("")
	assert.NoError(t, err)
	assert.Empty(t, d)
	assert.False(t, errors.Is(err, ErrCorrupt))
}

// TestALockHeldForAMomentIsWaitedOut: another command's sweep holds a
// name's lock only to see it has no record; a command taking the name
// then waits instead of refusing it as in use. The holder lets go at the
// first contention the lock sees, never after a sleep.
func TestALockHeldForAMomentIsWaitedOut(t *testing.T) {
	s := NewFileStore(t.TempDir())
	sweep, err := s.Lock("a")
	require.NoError(t, err)
	contended := 0
	lockContended = func(name string) {
		contended++
		if contended == 1 {
			assert.Equal(t, "a", name)
			sweep.Unlock()
		}
	}
	t.Cleanup(func() { lockContended = nil })
	l, err := s.Lock("a")
	require.NoError(t, err, "the sweep's moment is waited out")
	l.Unlock()
	assert.Equal(t, 1, contended)
}

// TestALockHeldLongerThanASweepIsRefused: a command that holds the name
// (a running sandbox) still refuses the next one, after sweepHold.
func TestALockHeldLongerThanASweepIsRefused(t *testing.T) {
	s := NewFileStore(t.TempDir())
	running, err := s.Lock("a")
	require.NoError(t, err)
	defer running.Unlock()
	t0 := time.Now()
	_, err = s.Lock("a")
	require.ErrorIs(t, err, ErrLocked)
	assert.GreaterOrEqual(t, time.Since(t0), sweepHold, "refused once a sweep's hold would have ended")
}
