package stage

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func host(s *server) string { return strings.TrimPrefix(s.URL, "http://") }

// serveCorrupt serves payload with one byte flipped, ranges honoured, as
// a mirror holding other bytes under the same name does.
func serveCorrupt(_ *server, w http.ResponseWriter, r *http.Request) {
	bad := append([]byte(nil), payload...)
	bad[len(bad)-10] ^= 0xff
	http.ServeContent(w, r, "file", time.Unix(0, 0), bytes.NewReader(bad))
}

func mirrored(first *server, rest ...*server) Target {
	t := target(first)
	for _, m := range rest {
		t.Mirrors = append(t.Mirrors, m.URL+"/file")
	}
	return t
}

func (r *recorder) of(kind string) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.ev {
		if e.Event == kind {
			out = append(out, e)
		}
	}
	return out
}

func TestATruncatedTransferResumesAtTheNextMirrorWithARangeRequest(t *testing.T) {
	a := newServer(t, truncating)
	b := newServer(t, serveGood)
	st, rec := newStager(t)
	res, err := st.Stage(context.Background(), mirrored(a, b))
	require.NoError(t, err)
	assert.Equal(t, int64(len(payload)/2), res.ResumedFrom, "the second mirror went on where the first stopped")
	assert.Equal(t, int64(len(payload)), res.Downloaded, "half from each: no byte fetched twice")
	assert.Equal(t, int32(1), b.ranges.Load())
	assert.Equal(t, int32(0), a.ranges.Load())
	assert.Equal(t, host(b), res.Mirror)
	require.Len(t, res.Failed, 1)
	assert.Contains(t, res.Failed[0], "download truncated: the connection to mirror "+host(a))
	got, _ := os.ReadFile(res.Path)
	assert.Equal(t, payload, got)
	assert.Equal(t, []string{EventStart, EventMirror, EventStart, EventDone}, rec.kinds())
	m := rec.of(EventMirror)[0]
	assert.Equal(t, host(a), m.Mirror)
	assert.Equal(t, host(b), m.Next)
	assert.Equal(t, "truncated", m.Code)
	assert.Equal(t, int64(len(payload)/2), m.Bytes, "the kept bytes the next mirror resumes")
	assert.Equal(t, host(b), rec.of(EventDone)[0].Mirror)
	assertNothingPlacedPartial(t, st)
}

func TestAMirrorServingWrongBytesIsNamedAndNeverPoisonsTheStore(t *testing.T) {
	bad := newServer(t, serveCorrupt)
	good := newServer(t, serveGood)
	st, rec := newStager(t)
	res, err := st.Stage(context.Background(), mirrored(bad, good))
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	assert.Contains(t, res.Failed[0], "download corrupted")
	assert.Contains(t, res.Failed[0], "mirror "+host(bad)+" served other bytes")
	assert.Zero(t, res.ResumedFrom, "the corrupt bytes were discarded: the good mirror sent the whole file")
	assert.Equal(t, int32(0), good.ranges.Load())
	got, _ := os.ReadFile(res.Path)
	assert.Equal(t, payload, got)
	m := rec.of(EventMirror)[0]
	assert.Equal(t, "corrupt", m.Code)
	assert.Equal(t, host(bad), m.Mirror)
	assert.Zero(t, m.Bytes, "nothing of the corrupt transfer is kept")

	// Only the corrupt mirror: nothing placed, nothing kept.
	st2, _ := newStager(t)
	_, err = st2.Stage(context.Background(), mirrored(bad))
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "mirror "+host(bad)+" served other bytes")
	assertNothingPlaced(t, st2, false)
}

func TestEveryMirrorFailingGivesTheLastOnesCodeAndNamesEach(t *testing.T) {
	bad := newServer(t, serveCorrupt)
	half := newServer(t, func(s *server, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		truncating(s, w, r)
	})
	gone := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) { http.Error(w, "gone", http.StatusGone) })
	st, _ := newStager(t)
	_, err := st.Stage(context.Background(), mirrored(bad, half, gone))
	require.ErrorIs(t, err, ErrHTTP, "the code is the last mirror's")
	assert.Equal(t, "http", Code(err))
	assert.Contains(t, err.Error(), "mirror "+host(gone)+" answered 410 Gone")
	assert.Contains(t, err.Error(), "mirror "+host(bad)+" served other bytes")
	assert.Contains(t, err.Error(), "the connection to mirror "+host(half)+" ended after")
	assert.NotContains(t, err.Error(), "/file", "mirrors are named by host only")
	assertNothingPlaced(t, st, true)
	kept, err := os.ReadFile(filepath.Join(st.Store, "tmp", digest(payload)+".partial"))
	require.NoError(t, err)
	assert.Equal(t, payload[:len(payload)/2], kept, "the half a mirror sent stays for the next run; a refusal does not touch it")
}

func TestAPrefixThatDoesNotVerifyAtTheNextMirrorIsFetchedWholeFromItAndItIsNamed(t *testing.T) {
	a := newServer(t, truncating)
	bad := newServer(t, serveCorrupt)
	good := newServer(t, serveGood)
	st, rec := newStager(t)
	res, err := st.Stage(context.Background(), mirrored(a, bad, good))
	require.NoError(t, err)
	assert.Equal(t, int32(1), bad.ranges.Load(), "the corrupt mirror resumed the first half once")
	assert.Equal(t, int32(2), bad.gets.Load(), "then sent the whole file, which did not verify either")
	assert.Equal(t, int32(0), good.ranges.Load(), "the good mirror sent everything: nothing of the others was kept")
	require.Len(t, rec.of(EventRetry), 1)
	assert.Equal(t, host(bad), rec.of(EventRetry)[0].Mirror)
	require.Len(t, res.Failed, 2)
	assert.Contains(t, res.Failed[1], "mirror "+host(bad)+" served other bytes", "named only once it sent every byte")
	got, _ := os.ReadFile(res.Path)
	assert.Equal(t, payload, got)
}

func TestARefusingMirrorLeavesAKeptPrefixForTheNext(t *testing.T) {
	refuses := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusForbidden) })
	good := newServer(t, serveGood)
	st, _ := newStager(t)
	require.NoError(t, os.MkdirAll(filepath.Join(st.Store, "tmp"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(st.Store, "tmp", digest(payload)+".partial"), payload[:1000], 0o644))
	res, err := st.Stage(context.Background(), mirrored(refuses, good))
	require.NoError(t, err)
	assert.Equal(t, int64(1000), res.ResumedFrom)
	assert.Equal(t, int64(len(payload)-1000), res.Downloaded)
	assert.Contains(t, res.Failed[0], "answered 403 Forbidden")
}

func TestAnUnreachableMirrorIsNamedByHostAndTheNextTried(t *testing.T) {
	down := newServer(t, serveGood)
	down.Close()
	good := newServer(t, serveGood)
	st, _ := newStager(t)
	tg := target(down)
	tg.URL = down.URL + "/private/path/file"
	tg.Mirrors = []string{good.URL + "/file"}
	res, err := st.Stage(context.Background(), tg)
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	assert.Contains(t, res.Failed[0], "mirror "+host(down)+": request failed")
	assert.NotContains(t, res.Failed[0], "private", "never the URL's path")
}

func TestACanceledStageTriesNoFurtherMirror(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	a := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "307200")
		_, _ = w.Write(payload[:100])
		w.(http.Flusher).Flush()
		cancel()
		<-r.Context().Done()
	})
	b := newServer(t, serveGood)
	st, _ := newStager(t)
	_, err := st.Stage(ctx, mirrored(a, b))
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int32(0), b.gets.Load())
	assertNothingPlaced(t, st, true)
}

func TestStageRefusesBadMirrors(t *testing.T) {
	st, _ := newStager(t)
	base := Target{URL: "https://a.example/x", Size: 1, SHA256: digest(nil)}
	for name, mirrors := range map[string][]string{
		"plain http":   {"http://b.example/x"},
		"query":        {"https://b.example/x?sig=secret"},
		"same as url":  {"https://a.example/x"},
		"listed twice": {"https://b.example/x", "https://b.example/x"},
		"too many":     strings.Split(strings.Repeat("https://b.example/x,", 8), ",")[:8],
	} {
		tg := base
		tg.Mirrors = mirrors
		_, err := st.Stage(context.Background(), tg)
		assert.Error(t, err, name)
		assert.NotContains(t, err.Error(), "secret")
	}
}

func TestTheBarSaysWhichMirrorFailedAndWhichIsNext(t *testing.T) {
	var bar bytes.Buffer
	p := BarProgress(&bar)
	p(Event{Time: time.Now(), Event: EventMirror, Name: "image", Mirror: "a.example:443", Next: "b.example", Code: "truncated", Error: "download truncated", Bytes: 1000})
	assert.Equal(t, "\nimage: a.example:443 failed (truncated: download truncated); trying b.example, resuming at byte 1000\n", bar.String())
}
