package stage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var payload = func() []byte {
	b := make([]byte, 300<<10)
	for i := range b {
		b[i] = byte(i * 7 % 251)
	}
	return b
}()

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// server serves payload at /file with Range support through handler
// variations, and counts requests.
type server struct {
	*httptest.Server
	gets   atomic.Int32
	ranges atomic.Int32
}

func newServer(t *testing.T, h func(s *server, w http.ResponseWriter, r *http.Request)) *server {
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gets.Add(1)
		if r.Header.Get("Range") != "" {
			s.ranges.Add(1)
		}
		h(s, w, r)
	}))
	t.Cleanup(s.Close)
	require.True(t, strings.HasPrefix(s.URL, "http://127.0.0.1:"), "tests use loopback only")
	return s
}

func serveGood(_ *server, w http.ResponseWriter, r *http.Request) {
	http.ServeContent(w, r, "file", time.Unix(0, 0), bytes.NewReader(payload))
}

func target(s *server) Target {
	return Target{Name: "image", URL: s.URL + "/file", Size: int64(len(payload)), SHA256: digest(payload)}
}

type recorder struct {
	mu sync.Mutex
	ev []Event
}

func (r *recorder) add(e Event) { r.mu.Lock(); r.ev = append(r.ev, e); r.mu.Unlock() }
func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var k []string
	for _, e := range r.ev {
		if e.Event != EventProgress {
			k = append(k, e.Event)
		}
	}
	return k
}

func newStager(t *testing.T) (*Stager, *recorder) {
	rec := &recorder{}
	return &Stager{Store: t.TempDir(), Progress: rec.add, IdleTimeout: 2 * time.Second, ProgressInterval: time.Millisecond}, rec
}

// assertNothingPlaced: no final file and (unless keep) no partial file.
func assertNothingPlaced(t *testing.T, st *Stager, keepPartial bool) {
	t.Helper()
	_, err := os.Stat(filepath.Join(st.Store, "sha256", digest(payload)))
	assert.True(t, os.IsNotExist(err), "nothing placed in the store")
	_, err = os.Stat(filepath.Join(st.Store, "tmp", digest(payload)+".partial"))
	assert.Equal(t, keepPartial, err == nil, "partial kept: %v", keepPartial)
}

func TestStageDownloadsVerifiesAndPlacesReadOnly(t *testing.T) {
	s := newServer(t, serveGood)
	st, rec := newStager(t)
	res, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(st.Store, "sha256", digest(payload)), res.Path)
	b, err := os.ReadFile(res.Path)
	require.NoError(t, err)
	assert.Equal(t, payload, b)
	fi, err := os.Stat(res.Path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o444), fi.Mode().Perm())
	assert.Equal(t, []string{EventStart, EventDone}, rec.kinds())
	assertNothingPlacedPartial(t, st)

	// Again: served from the store, no request.
	res, err = st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.True(t, res.Cached)
	assert.Equal(t, int32(1), s.gets.Load())
}

func assertNothingPlacedPartial(t *testing.T, st *Stager) {
	t.Helper()
	_, err := os.Stat(filepath.Join(st.Store, "tmp", digest(payload)+".partial"))
	assert.True(t, os.IsNotExist(err), "no partial file left")
}

func TestStageRefusesCorruptContent(t *testing.T) {
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		bad := append([]byte(nil), payload...)
		bad[1000] ^= 0xff
		http.ServeContent(w, r, "file", time.Unix(0, 0), bytes.NewReader(bad))
	})
	st, rec := newStager(t)
	_, err := st.Stage(context.Background(), target(s))
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "sha256 does not match the pin")
	assertNothingPlaced(t, st, false)
	assert.Equal(t, "corrupt", rec.ev[len(rec.ev)-1].Code)
}

// truncating sends the headers of the whole file and then only half of it.
func truncating(_ *server, w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Range") != "" {
		http.ServeContent(w, r, "file", time.Unix(0, 0), bytes.NewReader(payload))
		return
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(payload[:len(payload)/2])
	w.(http.Flusher).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

func TestStageTruncatedKeepsThePartialAndTheNextStageResumesIt(t *testing.T) {
	s := newServer(t, truncating)
	st, _ := newStager(t)
	_, err := st.Stage(context.Background(), target(s))
	require.ErrorIs(t, err, ErrTruncated)
	assert.Contains(t, err.Error(), "the next attempt resumes it")
	assertNothingPlaced(t, st, true)

	res, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.Equal(t, int64(len(payload)/2), res.ResumedFrom)
	assert.Equal(t, int64(len(payload)-len(payload)/2), res.Downloaded, "only the rest was fetched")
	assert.Equal(t, int32(1), s.ranges.Load())
	b, _ := os.ReadFile(res.Path)
	assert.Equal(t, payload, b)
	assertNothingPlacedPartial(t, st)
}

func TestStageResumeFromAServerThatIgnoresRangesStartsOver(t *testing.T) {
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
		_, _ = w.Write(payload)
	})
	st, _ := newStager(t)
	require.NoError(t, os.MkdirAll(filepath.Join(st.Store, "tmp"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(st.Store, "tmp", digest(payload)+".partial"), payload[:1000], 0o644))
	res, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.Zero(t, res.ResumedFrom)
	assert.Equal(t, int64(len(payload)), res.Downloaded)
}

func TestStageResumedPrefixThatIsWrongIsFetchedAgainFromTheStart(t *testing.T) {
	s := newServer(t, serveGood)
	st, rec := newStager(t)
	require.NoError(t, os.MkdirAll(filepath.Join(st.Store, "tmp"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(st.Store, "tmp", digest(payload)+".partial"), bytes.Repeat([]byte("x"), 1000), 0o644))
	res, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.Contains(t, rec.kinds(), EventRetry)
	b, _ := os.ReadFile(res.Path)
	assert.Equal(t, payload, b)
}

func TestStageWrongSize(t *testing.T) {
	for name, h := range map[string]func(*server, http.ResponseWriter, *http.Request){
		"announced": func(_ *server, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "10")
			_, _ = w.Write(payload[:10])
		},
		"sent more": func(_ *server, w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush() // chunked: no length announced
			_, _ = w.Write(payload)
			_, _ = w.Write([]byte("extra"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, h)
			st, _ := newStager(t)
			_, err := st.Stage(context.Background(), target(s))
			require.ErrorIs(t, err, ErrWrongSize)
			assertNothingPlaced(t, st, false)
		})
	}
}

func TestStageHTTPErrors(t *testing.T) {
	for _, code := range []int{404, 500, 403} {
		s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) { http.Error(w, "no", code) })
		st, _ := newStager(t)
		_, err := st.Stage(context.Background(), target(s))
		require.ErrorIs(t, err, ErrHTTP)
		var he *HTTPError
		require.True(t, errors.As(err, &he))
		assert.Equal(t, code, he.Status)
		assert.Contains(t, err.Error(), fmt.Sprintf("mirror %s answered %d", strings.TrimPrefix(s.URL, "http://"), code))
		assertNothingPlaced(t, st, false)
	}
}

func TestStageStalledServerTimesOutAndKeepsThePartial(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
		_, _ = w.Write(payload[:4096])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	st, _ := newStager(t)
	st.IdleTimeout = 300 * time.Millisecond
	begin := time.Now()
	_, err := st.Stage(context.Background(), target(s))
	require.ErrorIs(t, err, ErrStalled)
	assert.Less(t, time.Since(begin), 5*time.Second)
	assert.Contains(t, err.Error(), "nothing received for 300ms after 4096 of")
	assertNothingPlaced(t, st, true)
}

func TestStageStalledBeforeHeaders(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	st, _ := newStager(t)
	st.IdleTimeout = 200 * time.Millisecond
	_, err := st.Stage(context.Background(), target(s))
	require.ErrorIs(t, err, ErrStalled)
	assert.Contains(t, err.Error(), "no response from mirror "+strings.TrimPrefix(s.URL, "http://")+" within")
}

func TestTwoStagersOfOneDigestShareOneDownload(t *testing.T) {
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
		for i := 0; i < len(payload); i += 32 << 10 {
			_, _ = w.Write(payload[i:min(i+32<<10, len(payload))])
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
	})
	store := t.TempDir()
	var wg sync.WaitGroup
	results := make([]Result, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &Stager{Store: store, LockPoll: 5 * time.Millisecond}
			results[i], errs[i] = st.Stage(context.Background(), target(s))
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, int32(1), s.gets.Load(), "one download")
	assert.True(t, results[0].Shared != results[1].Shared, "one waited and shared the other's download")
}

func TestStageReplacesADamagedStoreFileAndSaysSo(t *testing.T) {
	s := newServer(t, serveGood)
	st, rec := newStager(t)
	p := filepath.Join(st.Store, "sha256", digest(payload))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte("damaged"), 0o444))
	res, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.False(t, res.Cached)
	assert.Contains(t, res.Repaired, "wrong size")
	b, _ := os.ReadFile(p)
	assert.Equal(t, payload, b)
	assert.Equal(t, []string{EventVerify, EventRepair, EventStart, EventDone}, rec.kinds())
	for _, e := range rec.ev {
		if e.Event == EventRepair {
			assert.Regexp(t, `^the staged file was damaged \(wrong size: .*\): removed it; staging it again$`, e.Error)
		}
	}

	// A file of the right size with other bytes.
	bad := append([]byte(nil), payload...)
	bad[7] ^= 1
	require.NoError(t, os.Chmod(p, 0o644))
	require.NoError(t, os.WriteFile(p, bad, 0o444))
	res, err = st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	assert.Contains(t, res.Repaired, "sha256")
}

func TestNoLockFileStaysInTheStore(t *testing.T) {
	s := newServer(t, serveGood)
	st, _ := newStager(t)
	_, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	bad := target(s)
	bad.SHA256 = digest([]byte("other"))
	_, err = st.Stage(context.Background(), bad)
	require.ErrorIs(t, err, ErrCorrupt)
	ents, err := os.ReadDir(filepath.Join(st.Store, "tmp"))
	require.NoError(t, err)
	assert.Empty(t, ents, "neither a staged nor a failed download leaves a lock file")
}

func TestManyStagersOfOneDigestStillShareOneDownloadWithLockFilesRemoved(t *testing.T) {
	s := newServer(t, func(_ *server, w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		serveGood(nil, w, r)
	})
	store := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &Stager{Store: store, LockPoll: time.Millisecond}
			_, errs[i] = st.Stage(context.Background(), target(s))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), s.gets.Load(), "a lock removed by its holder is never held twice")
	ents, _ := os.ReadDir(filepath.Join(store, "tmp"))
	assert.Empty(t, ents)
}

func TestStageRefusesBadTargets(t *testing.T) {
	st, _ := newStager(t)
	for _, tg := range []Target{
		{URL: "http://example.com/x", Size: 1, SHA256: digest(nil)},
		{URL: "https://example.com/x", Size: 0, SHA256: digest(nil)},
		{URL: "https://example.com/x", Size: 1, SHA256: "ABC"},
		{URL: "ftp://example.com/x", Size: 1, SHA256: digest(nil)},
	} {
		_, err := st.Stage(context.Background(), tg)
		assert.Error(t, err)
	}
}

func TestJSONProgressIsOneObjectPerLine(t *testing.T) {
	s := newServer(t, serveGood)
	var buf bytes.Buffer
	st := &Stager{Store: t.TempDir(), Progress: JSONProgress(&buf), ProgressInterval: time.Millisecond}
	_, err := st.Stage(context.Background(), target(s))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	for _, l := range lines {
		var e map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		assert.Contains(t, e, "event")
		assert.Equal(t, "image", e["name"])
	}
	var bar bytes.Buffer
	p := BarProgress(&bar)
	now := time.Now()
	p(Event{Time: now, Event: EventStart, Name: "image", Total: 100})
	p(Event{Time: now.Add(time.Second), Event: EventProgress, Name: "image", Bytes: 50, Total: 100})
	p(Event{Time: now.Add(time.Second), Event: EventDone, Name: "image", Bytes: 100, Total: 100})
	assert.Contains(t, bar.String(), "[###############...............]  50% 50 B/100 B 50 B/s")
	assert.Contains(t, bar.String(), "image: staged and verified")
}

func TestParseContentRange(t *testing.T) {
	for v, want := range map[string][3]int64{
		"bytes 10-99/100": {10, 100, 1},
		"bytes 0-0/*":     {0, -1, 1},
		"bytes 10-9/100":  {0, 0, 0},
		"bytes 10-99/99":  {0, 0, 0},
		"items 1-2/3":     {0, 0, 0},
		"bytes -1-2/3":    {0, 0, 0},
	} {
		from, total, ok := parseContentRange(v)
		if want[2] == 0 {
			assert.False(t, ok, v)
			continue
		}
		assert.True(t, ok, v)
		assert.Equal(t, [2]int64{want[0], want[1]}, [2]int64{from, total}, v)
	}
}

func FuzzParseContentRange(f *testing.F) {
	f.Add("bytes 10-99/100")
	f.Add("bytes 0-0/*")
	f.Add("bytes 9223372036854775807-9223372036854775807/*")
	f.Fuzz(func(t *testing.T, v string) {
		from, total, ok := parseContentRange(v)
		if ok && (from < 0 || (total != -1 && total <= from)) {
			t.Fatalf("accepted an impossible range %q: from %d total %d", v, from, total)
		}
	})
}
