package shimcli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apiserver"
	"github.com/oac/sandbox-agent/host/journal"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

// fakeOutliving is what an outliving shim keeps in the registry, made by
// the same calls the shim makes: its entry (lock held), its journal fed
// by the events sink, its record and, when asked, a control socket.
type fakeOutliving struct {
	t    *testing.T
	reg  *kept.Registry
	a    *kept.Announcement
	jw   *journal.Writer
	sink *api.JSONLines
	stop context.CancelFunc
	done chan struct{}
}

func newFakeOutliving(t *testing.T, reg *kept.Registry, name string, handler apiserver.Handler) *fakeOutliving {
	t.Helper()
	a, err := reg.Claim(name)
	require.NoError(t, err)
	jw, err := journal.Create(a.Dir())
	require.NoError(t, err)
	f := &fakeOutliving{t: t, reg: reg, a: a, jw: jw, sink: api.NewJSONLines(io.Discard), done: make(chan struct{})}
	f.sink.Tap(func(seq uint64, line []byte) { require.NoError(t, jw.Write(seq, line)) })
	rec := kept.ShimRecord{Name: name, Kind: api.RunThrowaway, Provider: "bwrap", PID: os.Getpid(), Started: time.Now().UTC(), Version: "test"}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	if handler != nil {
		rec.ControlSocket = filepath.Join(a.Dir(), controlSocketName)
		ln, err := sockfile.Listen(rec.ControlSocket)
		require.NoError(t, err)
		srv := &apiserver.Server{Sandbox: name, Handler: handler}
		go func() { defer close(f.done); srv.ServeSocket(ctx, ln) }()
	} else {
		close(f.done)
	}
	require.NoError(t, a.Publish(rec))
	t.Cleanup(f.end)
	return f
}

func (f *fakeOutliving) emit(e api.Event) {
	e.Sandbox = "s"
	e.Time = time.Now().UTC()
	f.sink.Emit(e)
}

func (f *fakeOutliving) logs(n int) {
	for i := range n {
		f.emit(api.Event{Event: api.KindLog, Stream: "daemon/stdout", Line: fmt.Sprint("line ", i)})
	}
}

// end is the shim's orderly end: the control API closed, the journal
// kept for attach, the entry released.
func (f *fakeOutliving) end() {
	f.stop()
	<-f.done
	f.sink.Tap(nil)
	_ = f.jw.Close()
	f.a.KeepOnClose(journal.IsSegment)
	f.a.Close()
}

// attachRun runs Attach in the background; its stdout is read line by
// line (each read waits for the line).
type attachRun struct {
	out    *bufio.Reader
	stdin  *io.PipeWriter
	stderr *bytes.Buffer
	code   chan int
}

func startAttach(t *testing.T, reg *kept.Registry, opts AttachOptions) *attachRun {
	t.Helper()
	pr, pw := io.Pipe()
	inR, inW := io.Pipe()
	a := &attachRun{out: bufio.NewReader(pr), stdin: inW, stderr: &bytes.Buffer{}, code: make(chan int, 1)}
	go func() {
		code := Attach(reg, opts, inR, pw, a.stderr)
		pw.Close()
		a.code <- code
	}()
	t.Cleanup(func() { inW.Close() })
	return a
}

type attachLine struct {
	Event    string `json:"event"`
	Seq      uint64 `json:"seq"`
	State    string `json:"state"`
	Line     string `json:"line"`
	ID       string `json:"id"`
	OK       bool   `json:"ok"`
	Code     string `json:"code"`
	LostFrom uint64 `json:"lost_from"`
	LostTo   uint64 `json:"lost_to"`
}

func (a *attachRun) next(t *testing.T) attachLine {
	t.Helper()
	b, err := a.out.ReadBytes('\n')
	require.NoError(t, err, "attach's next line (stderr: %s)", a.stderr)
	var l attachLine
	require.NoError(t, json.Unmarshal(b, &l), "%s", b)
	return l
}

func (a *attachRun) exit(t *testing.T) int {
	t.Helper()
	rest, _ := io.ReadAll(a.out)
	assert.Empty(t, string(rest), "nothing more on stdout")
	select {
	case c := <-a.code:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("attach did not exit")
		return -1
	}
}

func TestAttachReplaysFromASeqThenFollowsAndEndsWithTheStoppedState(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.logs(5)
	a := startAttach(t, reg, AttachOptions{Name: "s", From: 3})
	for _, want := range []uint64{3, 4, 5} {
		assert.Equal(t, want, a.next(t).Seq)
	}
	f.logs(2) // live: after the attach caught up
	assert.Equal(t, uint64(6), a.next(t).Seq)
	assert.Equal(t, uint64(7), a.next(t).Seq)
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped, Message: "stopped: stop command"})
	l := a.next(t)
	assert.Equal(t, [2]any{uint64(8), "stopped"}, [2]any{l.Seq, l.State})
	f.end()
	assert.Equal(t, 0, a.exit(t))
	assert.NoDirExists(t, reg.EntryDir("s"), "the journal an ended shim left is removed once read to its end")
}

func TestAttachSaysSoWhenTheSeqIsOlderThanTheJournalKeeps(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.jw.SegmentBytes, f.jw.Segments = 2048, 2
	f.logs(100)
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped})
	f.end()
	a := startAttach(t, reg, AttachOptions{Name: "s", From: 2})
	lost := a.next(t)
	require.Equal(t, api.KindEventsLost, lost.Event)
	assert.Equal(t, uint64(2), lost.LostFrom)
	assert.Equal(t, lost.LostTo, lost.Seq, "the line stands for the lost ones")
	assert.Equal(t, lost.LostTo+1, a.next(t).Seq, "then the oldest line kept")
	for l := a.next(t); l.Event != api.KindState; l = a.next(t) {
	}
	assert.Equal(t, 0, a.exit(t))
}

func TestAttachFromNowGivesOnlyLaterEvents(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.logs(3)
	opened := make(chan struct{})
	a := startAttach(t, reg, AttachOptions{Name: "s", Now: true, following: func() { close(opened) }})
	<-opened
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped})
	l := a.next(t)
	assert.Equal(t, [2]any{uint64(4), "stopped"}, [2]any{l.Seq, l.State})
	f.end()
	assert.Equal(t, 0, a.exit(t))
}

// shortRoot is a keep root whose entries' sockets fit a socket path.
func shortRoot(t *testing.T) string {
	d, err := os.MkdirTemp("", "oa")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestAttachForwardsCommandsToTheControlSocketAndPrintsTheAnswers(t *testing.T) {
	reg := kept.OpenRegistry(shortRoot(t))
	var f *fakeOutliving
	stopped := make(chan struct{})
	f = newFakeOutliving(t, reg, "s", apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		if c.Cmd == api.CmdStop {
			defer close(stopped)
		}
		return api.StatusResult{Status: api.Status{ServerID: "sandbox:s", State: api.StateReady, Attempt: 1}}, nil
	}))
	f.logs(1)
	a := startAttach(t, reg, AttachOptions{Name: "s"})
	assert.Equal(t, uint64(1), a.next(t).Seq)
	_, err := io.WriteString(a.stdin, `{"id":"7","cmd":"status"}`+"\n")
	require.NoError(t, err)
	ans := a.next(t)
	assert.Equal(t, attachLine{Event: api.KindAnswer, ID: "7", OK: true}, ans, "the answer as the shim gives it (no seq: not a line of its events)")
	_, err = io.WriteString(a.stdin, `{"id":"8","cmd":"stop"}`+"\n")
	require.NoError(t, err)
	assert.Equal(t, "8", a.next(t).ID)
	<-stopped
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped, Message: "stopped: stop command"})
	assert.Equal(t, "stopped", a.next(t).State)
	f.end()
	assert.Equal(t, 0, a.exit(t))
}

// killedShim leaves what a shim SIGKILLed while it ran leaves: its
// entry with a free lock, its record and its journal, the last line torn
// when torn is set.
func killedShim(t *testing.T, reg *kept.Registry, name string, lines int, torn bool) {
	t.Helper()
	a, err := reg.Claim(name)
	require.NoError(t, err)
	jw, err := journal.Create(a.Dir())
	require.NoError(t, err)
	sink := api.NewJSONLines(io.Discard)
	sink.Tap(func(seq uint64, line []byte) { require.NoError(t, jw.Write(seq, line)) })
	require.NoError(t, a.Publish(kept.ShimRecord{Name: name, Kind: api.RunThrowaway, Provider: "bwrap", PID: 4242, Started: time.Now().UTC(), Version: "test"}))
	sink.Emit(api.Event{Sandbox: name, Event: api.KindState, State: api.StateStarting, Attempt: 1})
	for range lines - 1 {
		sink.Emit(api.Event{Sandbox: name, Event: api.KindLog, Line: "x", Attempt: 1})
	}
	if torn {
		type tornHere struct{}
		jw.TearNext(func() { panic(tornHere{}) })
		func() {
			defer func() { require.IsType(t, tornHere{}, recover()) }()
			sink.Emit(api.Event{Sandbox: name, Event: api.KindState, State: api.StateReady, Attempt: 1})
		}()
	}
	// The kill: the lock goes with the process, everything else stays.
	a.KeepOnClose(func(string) bool { return true })
	require.NoError(t, os.WriteFile(filepath.Join(a.Dir(), "shim.json.kept"), nil, 0o600))
	data, err := os.ReadFile(filepath.Join(a.Dir(), "shim.json"))
	require.NoError(t, err)
	a.Close()
	require.NoError(t, os.WriteFile(filepath.Join(reg.EntryDir(name), "shim.json"), data, 0o600))
}

func TestAttachReadsAKilledShimsJournalToTheKillAndReportsItDead(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	killedShim(t, reg, "s", 3, false)
	a := startAttach(t, reg, AttachOptions{Name: "s", From: 2})
	assert.Equal(t, uint64(2), a.next(t).Seq)
	assert.Equal(t, uint64(3), a.next(t).Seq)
	assert.Equal(t, api.ExitShimDied, a.exit(t))
	assert.Contains(t, a.stderr.String(), "the sandbox s is gone: its shim (pid 4242")
	assert.Contains(t, a.stderr.String(), "died without a final state")
	assert.DirExists(t, reg.EntryDir("s"), "a killed shim's entry stays for list --running to report")
	_, cleaned, err := reg.List()
	require.NoError(t, err)
	require.Len(t, cleaned, 1)
	assert.Contains(t, cleaned[0].Message, "pid 4242")
	assert.NoDirExists(t, reg.EntryDir("s"))
}

func TestAttachToleratesATornFinalLineAndSaysSo(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	killedShim(t, reg, "s", 2, true)
	a := startAttach(t, reg, AttachOptions{Name: "s"})
	assert.Equal(t, uint64(1), a.next(t).Seq)
	assert.Equal(t, uint64(2), a.next(t).Seq)
	assert.Equal(t, api.ExitShimDied, a.exit(t))
	assert.Contains(t, a.stderr.String(), "the journal's last line is torn")
}

func TestAttachWithNothingToAttachToSaysSo(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	a := startAttach(t, reg, AttachOptions{Name: "nobody"})
	assert.Equal(t, api.ExitNotRunning, a.exit(t))
	assert.Contains(t, a.stderr.String(), "no sandbox nobody runs under")

	// A shim without --outlive-parent: listed, but no journal.
	ann, err := reg.Announce(kept.ShimRecord{Name: "plain", Kind: api.RunThrowaway, Provider: "bwrap", PID: os.Getpid(), Started: time.Now().UTC(), Version: "test"})
	require.NoError(t, err)
	defer ann.Close()
	a = startAttach(t, reg, AttachOptions{Name: "plain"})
	assert.Equal(t, api.ExitNotRunning, a.exit(t))
	assert.Contains(t, a.stderr.String(), "runs without --outlive-parent")
}

func TestAttachAnswersCommandsItCannotDeliverWithAnError(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil) // serves no control socket
	a := startAttach(t, reg, AttachOptions{Name: "s"})
	_, err := io.WriteString(a.stdin, `{"id":"1","cmd":"status"}`+"\n")
	require.NoError(t, err)
	ans := a.next(t)
	assert.Equal(t, attachLine{Event: api.KindAnswer, ID: "1", Code: api.AnswerStopping}, ans)
	f.emit(api.Event{Event: api.KindState, State: api.StateFailed, Code: api.CodeBootTimeout, Message: "x"})
	assert.Equal(t, "failed", a.next(t).State)
	f.end()
	assert.Equal(t, api.FailureOf(api.CodeBootTimeout).Exit, a.exit(t), "a failed end exits as oac-shim run would")
}

func TestAttachCommandLine(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{}, api.ExitUsage, "NAME is required"},
		{[]string{"a", "b"}, api.ExitUsage, "takes one NAME"},
		{[]string{"Bad_Name"}, api.ExitUsage, "not a sandbox name"},
		{[]string{"a", "--from", "0"}, api.ExitUsage, "--from takes a seq"},
		{[]string{"--from", "x", "a"}, api.ExitUsage, "--from takes a seq"},
		{[]string{"a", "--from", "now", "--keep-root", root}, api.ExitNotRunning, "no sandbox a runs"},
		{[]string{"--keep-root", root, "a", "--from", "5"}, api.ExitNotRunning, "no sandbox a runs"},
	} {
		var out, errOut bytes.Buffer
		code := Main(append([]string{"attach"}, tc.args...), strings.NewReader(""), &out, &errOut)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, errOut.String())
		assert.Contains(t, errOut.String(), tc.err, "%v", tc.args)
	}
	var out, errOut bytes.Buffer
	assert.Equal(t, 0, Main([]string{"attach", "-h"}, strings.NewReader(""), &out, &errOut))
	assert.Contains(t, out.String(), "usage: oac-shim attach [flags] NAME")
}

func TestAttachWaitsForTheRecordOfAShimThatHasJustClaimedItsEntry(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	a, err := reg.Claim("s")
	require.NoError(t, err)
	defer a.Close()
	jw, err := journal.Create(a.Dir())
	require.NoError(t, err)
	defer jw.Close()
	_, err = reg.Open("s")
	require.ErrorIs(t, err, kept.ErrNoRecord)
	begin := time.Now()
	_, err = openPublished(reg, "s")
	assert.ErrorIs(t, err, kept.ErrNoRecord, "a record that never comes")
	assert.GreaterOrEqual(t, time.Since(begin), recordWait, "after the wait")
	published := make(chan struct{})
	go func() {
		defer close(published)
		assert.NoError(t, a.Publish(kept.ShimRecord{Name: "s", Kind: api.RunThrowaway, Provider: "bwrap", PID: os.Getpid(), Started: time.Now().UTC(), Version: "test"}))
	}()
	w, err := openPublished(reg, "s")
	require.NoError(t, err, "found once published, within the wait")
	w.Close()
	<-published
}

// Two callers attach to one sandbox at once (a restarted parent and a
// tool): each reads the whole journal to the final state, and only the
// last one done removes it.
func TestTwoAttachesOfAnEndedShimEachReadItAllAndTheLastRemovesIt(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.logs(3)
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped})
	f.end()

	// The second attach has pinned the journal and opened it; the first
	// runs whole at that point, its removal included.
	var first *attachRun
	second := startAttach(t, reg, AttachOptions{Name: "s", following: func() {
		first = startAttach(t, reg, AttachOptions{Name: "s"})
		for _, want := range []uint64{1, 2, 3, 4} {
			assert.Equal(t, want, first.next(t).Seq)
		}
		assert.Equal(t, 0, first.exit(t), "stderr: %s", first.stderr)
		assert.DirExists(t, reg.EntryDir("s"), "the other attach still reads it")
	}})
	for _, want := range []uint64{1, 2, 3, 4} {
		assert.Equal(t, want, second.next(t).Seq)
	}
	assert.Equal(t, 0, second.exit(t), "stderr: %s", second.stderr)
	assert.NoDirExists(t, reg.EntryDir("s"), "the last reader removed it")
}

func TestTwoAttachesFollowingALiveShimBothSeeItsEnd(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.logs(2)
	opened := make(chan struct{})
	slow := startAttach(t, reg, AttachOptions{Name: "s", following: func() { close(opened) }})
	<-opened
	fast := startAttach(t, reg, AttachOptions{Name: "s"})
	f.logs(1)
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped})
	f.end()
	// The fast one reads to the end and exits while the slow one has not
	// read a line (its output is not read yet).
	for _, want := range []uint64{1, 2, 3, 4} {
		assert.Equal(t, want, fast.next(t).Seq)
	}
	assert.Equal(t, 0, fast.exit(t), "stderr: %s", fast.stderr)
	for _, want := range []uint64{1, 2, 3, 4} {
		assert.Equal(t, want, slow.next(t).Seq)
	}
	assert.Equal(t, 0, slow.exit(t), "stderr: %s", slow.stderr)
	assert.NoDirExists(t, reg.EntryDir("s"))
}

func TestListingWhileAnAttachReadsAnEndedShimsJournalLeavesItAlone(t *testing.T) {
	reg := kept.OpenRegistry(t.TempDir())
	f := newFakeOutliving(t, reg, "s", nil)
	f.logs(2)
	f.emit(api.Event{Event: api.KindState, State: api.StateStopped})
	f.end()
	a := startAttach(t, reg, AttachOptions{Name: "s", following: func() {
		running, cleaned, err := reg.List()
		require.NoError(t, err)
		assert.Empty(t, running)
		assert.Empty(t, cleaned, "nothing is reported cleaned while it is read")
		_, err = reg.Claim("s")
		assert.ErrorContains(t, err, "still being read", "nor is the name taken over")
	}})
	for _, want := range []uint64{1, 2, 3} {
		assert.Equal(t, want, a.next(t).Seq)
	}
	assert.Equal(t, 0, a.exit(t), "stderr: %s", a.stderr)
	assert.NoDirExists(t, reg.EntryDir("s"))
}
