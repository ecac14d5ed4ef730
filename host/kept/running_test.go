package kept

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/provider"
)

func shimRecord(name string) ShimRecord {
	return ShimRecord{Name: name, Kind: api.RunThrowaway, Provider: "bwrap", PID: 4242, ProcStart: 99,
		ControlSocket: "/run/user/1000/" + name + ".ctl", Started: time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC), Version: "dev"}
}

func TestAnnouncedShimsAreListedByNameWithTheirControlSockets(t *testing.T) {
	keep := t.TempDir()
	g := OpenRegistry(keep)
	b, err := g.Announce(shimRecord("b"))
	require.NoError(t, err)
	defer b.Close()
	rec := shimRecord("a")
	rec.Kind, rec.ControlSocket = api.RunKept, ""
	a, err := g.Announce(rec)
	require.NoError(t, err)
	defer a.Close()

	st, err := os.Stat(filepath.Join(keep, "running"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the registry is the user's own")
	st, err = os.Stat(filepath.Join(keep, "running", "sandboxes", "a", "shim.json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	live, cleaned, err := g.List()
	require.NoError(t, err)
	assert.Empty(t, cleaned)
	require.Len(t, live, 2)
	rec.Schema = ShimRecordSchema
	assert.Equal(t, rec, live[0].Record)
	assert.Equal(t, api.RunningEntry{Name: "a", Kind: api.RunKept, Provider: "bwrap", PID: 4242,
		Started: rec.Started, Version: "dev"}, live[0].Entry())
	assert.Equal(t, "/run/user/1000/b.ctl", live[1].Entry().ControlSocket)

	_, err = g.Announce(shimRecord("a"))
	assert.ErrorIs(t, err, provider.ErrExists, "one live shim a name")

	a.Close()
	a.Close()
	live, _, err = g.List()
	require.NoError(t, err)
	require.Len(t, live, 1)
	assert.Equal(t, "b", live[0].Record.Name)
}

func TestADeadShimsRecordIsReportedCleanedAndNeverListedAsRunning(t *testing.T) {
	keep := t.TempDir()
	g := OpenRegistry(keep)
	// What a shim killed with SIGKILL leaves: its record, its lock free.
	dir := filepath.Join(keep, "running", "sandboxes", "crashed")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600))
	data, err := json.Marshal(ShimRecord{Schema: ShimRecordSchema, Name: "crashed", Kind: api.RunThrowaway, Provider: "bwrap",
		PID: 77, ProcStart: 1, Started: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), Version: "dev"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shim.json"), data, 0o600))

	live, cleaned, err := g.List()
	require.NoError(t, err)
	assert.Empty(t, live)
	assert.Equal(t, []api.CleanedEntry{{Name: "crashed",
		Message: "its shim (pid 77, started 2026-12-02T01:00:00Z) died without removing its record (killed or crashed); removed"}}, cleaned)
	assert.NoDirExists(t, dir)
	_, err = g.Open("crashed")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestOpenWatchesTheShimItReadAndSeesItGo(t *testing.T) {
	g := OpenRegistry(t.TempDir())
	_, err := g.Open("none")
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = g.Open("../x")
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)

	a, err := g.Announce(shimRecord("a"))
	require.NoError(t, err)
	w, err := g.Open("a")
	require.NoError(t, err)
	defer w.Close()
	assert.Equal(t, 4242, w.Record.PID)
	assert.False(t, w.Gone())
	a.Close()
	assert.True(t, w.Gone())
	again, err := g.Announce(shimRecord("a"))
	require.NoError(t, err)
	defer again.Close()
	assert.True(t, w.Gone(), "a later shim of the name is not the one watched")
}

func TestALiveShimWithAnUnreadableRecordIsListedWithWhy(t *testing.T) {
	g := OpenRegistry(t.TempDir())
	a, err := g.Announce(shimRecord("a"))
	require.NoError(t, err)
	defer a.Close()
	require.NoError(t, os.WriteFile(filepath.Join(g.Root, "sandboxes", "a", "shim.json"), []byte(`{"schema":1,"name":"a","name":"b"}`), 0o600))
	live, _, err := g.List()
	require.NoError(t, err)
	require.Len(t, live, 1)
	assert.ErrorIs(t, live[0].Err, ErrBadShimRecord)
	e := live[0].Entry()
	assert.Equal(t, "a", e.Name)
	assert.Zero(t, e.PID)
	assert.Contains(t, e.Message, "unreadable shim record")
	_, err = g.Open("a")
	assert.ErrorIs(t, err, ErrBadShimRecord)
}

func TestDecodeShimRecordRefusesWhatAShimNeverWrites(t *testing.T) {
	good, err := json.Marshal(func() ShimRecord { r := shimRecord("a"); r.Schema = ShimRecordSchema; return r }())
	require.NoError(t, err)
	_, err = DecodeShimRecord(good)
	require.NoError(t, err)
	for name, doc := range map[string]string{
		"unknown key":         `{"schema":1,"name":"a","kind":"run","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v","x":1}`,
		"missing pid":         `{"schema":1,"name":"a","kind":"run","provider":"p","proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"case variant":        `{"schema":1,"Name":"a","kind":"run","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"relative socket":     `{"schema":1,"name":"a","kind":"run","provider":"p","pid":1,"proc_start":1,"control_socket":"a.ctl","started":"2026-12-02T00:00:00Z","version":"v"}`,
		"bad name":            `{"schema":1,"name":"../a","kind":"run","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"bad kind":            `{"schema":1,"name":"a","kind":"vm","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"no pid":              `{"schema":1,"name":"a","kind":"run","provider":"p","pid":0,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"newer schema":        `{"schema":2,"name":"a","kind":"run","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
		"trailing data":       `{"schema":1,"name":"a","kind":"run","provider":"p","pid":1,"proc_start":1,"started":"2026-12-02T00:00:00Z","version":"v"} {}`,
		"negative proc_start": `{"schema":1,"name":"a","kind":"run","provider":"p","pid":1,"proc_start":-1,"started":"2026-12-02T00:00:00Z","version":"v"}`,
	} {
		_, err := DecodeShimRecord([]byte(doc))
		assert.ErrorIs(t, err, ErrBadShimRecord, name)
	}
	_, err = DecodeShimRecord(make([]byte, MaxShimRecord+1))
	assert.ErrorIs(t, err, ErrBadShimRecord, "over the bound")
}

// FuzzDecodeShimRecord feeds arbitrary bytes as a shim's record: never a
// panic; a refusal is ErrBadShimRecord; an accepted record is valid and
// encodes back to one that decodes the same.
func FuzzDecodeShimRecord(f *testing.F) {
	f.Add([]byte(`{"schema":1,"name":"a","kind":"run","provider":"bwrap","pid":12,"proc_start":3,"control_socket":"/run/a.ctl","started":"2026-12-02T00:00:00Z","version":"dev"}`))
	f.Add([]byte(`{"schema":1,"name":"a","kind":"kept","provider":"p","pid":1,"proc_start":0,"started":"2026-12-02T00:00:00Z","version":""}`))
	f.Add([]byte(`{"schema":1,"name":"a","name":"b"}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeShimRecord(data)
		if err != nil {
			require.ErrorIs(t, err, ErrBadShimRecord)
			return
		}
		require.NoError(t, r.validate())
		again, err := json.Marshal(r)
		require.NoError(t, err)
		r2, err := DecodeShimRecord(again)
		require.NoError(t, err)
		require.Equal(t, r.PID, r2.PID)
		require.Equal(t, r.ControlSocket, r2.ControlSocket)
	})
}

func TestAClaimedEntryIsListedOnceItsRecordIsPublished(t *testing.T) {
	g := OpenRegistry(t.TempDir())
	a, err := g.Claim("o")
	require.NoError(t, err)
	defer a.Close()
	assert.Equal(t, g.EntryDir("o"), a.Dir())
	_, err = g.Claim("o")
	assert.ErrorIs(t, err, provider.ErrExists, "the name is held from the claim")
	assert.Error(t, a.Publish(shimRecord("other")), "a record of another name")
	require.NoError(t, a.Publish(shimRecord("o")))
	w, err := g.Open("o")
	require.NoError(t, err)
	defer w.Close()
	assert.Equal(t, "o", w.Record.Name)
}

// An outliving shim's end: its record goes, what KeepOnClose names stays
// with the free lock for a reader (Leftover), and the next listing
// removes it without reporting it.
func TestAnEndedEntryKeepsWhatItNamesUntilTheNextListingRemovesItSilently(t *testing.T) {
	g := OpenRegistry(t.TempDir())
	a, err := g.Claim("o")
	require.NoError(t, err)
	require.NoError(t, a.Publish(shimRecord("o")))
	require.NoError(t, os.WriteFile(filepath.Join(a.Dir(), "journal-1"), []byte("x\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(a.Dir(), "control.sock"), nil, 0o600))
	a.KeepOnClose(func(n string) bool { return n == "journal-1" || n == "shim.json" })
	a.Close()

	left, err := g.Leftover("o")
	require.NoError(t, err)
	assert.Nil(t, left.Record, "the record went first: an ended shim's, not a killed one's")
	assert.FileExists(t, filepath.Join(left.Dir, "journal-1"))
	assert.NoFileExists(t, filepath.Join(left.Dir, "control.sock"))
	_, err = g.Open("o")
	assert.ErrorIs(t, err, os.ErrNotExist, "no shim runs it")

	live, cleaned, err := g.List()
	require.NoError(t, err)
	assert.Empty(t, live)
	assert.Empty(t, cleaned, "an ended shim's journal is not a death to report")
	assert.NoDirExists(t, g.EntryDir("o"))
}

func TestLeftoverFindsAKilledShimsRecordAndNothingOfALiveOne(t *testing.T) {
	g := OpenRegistry(t.TempDir())
	_, err := g.Leftover("none")
	assert.ErrorIs(t, err, os.ErrNotExist)
	a, err := g.Announce(shimRecord("live"))
	require.NoError(t, err)
	defer a.Close()
	_, err = g.Leftover("live")
	assert.ErrorIs(t, err, os.ErrNotExist, "a live shim's entry is no leftover")
	g.RemoveLeftover("live")
	assert.DirExists(t, g.EntryDir("live"), "a live entry is never removed")

	// A killed shim: the lock free, everything else there.
	k, err := g.Claim("killed")
	require.NoError(t, err)
	require.NoError(t, k.Publish(shimRecord("killed")))
	data, err := os.ReadFile(filepath.Join(k.Dir(), "shim.json"))
	require.NoError(t, err)
	k.KeepOnClose(func(string) bool { return true })
	k.Close()
	require.NoError(t, os.WriteFile(filepath.Join(g.EntryDir("killed"), "shim.json"), data, 0o600))
	left, err := g.Leftover("killed")
	require.NoError(t, err)
	require.NotNil(t, left.Record)
	assert.Equal(t, 4242, left.Record.PID)
	g.RemoveLeftover("killed")
	assert.NoDirExists(t, g.EntryDir("killed"))
}
