package stage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/manifest"
)

// Errors. Each failure wraps exactly one of them, so callers (and the
// desktop app, through the JSON events) can tell them apart.
var (
	// ErrCorrupt: all the bytes arrived but their sha256 is not the
	// pinned one. The partial file is discarded.
	ErrCorrupt = errors.New("download corrupted: sha256 does not match the pin")
	// ErrTruncated: the server ended the transfer early. The partial
	// file is kept; the next attempt resumes it.
	ErrTruncated = errors.New("download truncated")
	// ErrWrongSize: the server announced or sent a size other than the
	// pinned one. The partial file is discarded.
	ErrWrongSize = errors.New("wrong size")
	// ErrHTTP: the server answered with an error status (see HTTPError).
	ErrHTTP = errors.New("HTTP error")
	// ErrStalled: no byte arrived for the idle timeout. The partial file
	// is kept.
	ErrStalled = errors.New("download stalled")
	// ErrStore: the store could not be written or locked.
	ErrStore = errors.New("store error")
)

// HTTPError is an error status from the server.
type HTTPError struct {
	// Mirror is the server's host (and port), never more of its URL.
	Mirror string
	Status int
	Text   string
}

func (e *HTTPError) Error() string {
	if e.Mirror == "" {
		return fmt.Sprintf("server answered %d %s", e.Status, e.Text)
	}
	return fmt.Sprintf("mirror %s answered %d %s", e.Mirror, e.Status, e.Text)
}

// Unwrap makes errors.Is(err, ErrHTTP) true.
func (e *HTTPError) Unwrap() error { return ErrHTTP }

// Target is one file to stage.
type Target struct {
	// Name labels events and errors.
	Name string
	// URL is tried first, then Mirrors in order (at most
	// manifest.MaxMirrors, each under manifest.CheckURL's rule).
	URL     string
	Mirrors []string
	Size    int64
	SHA256  string
}

// FromArtifact turns a manifest artifact into a Target.
func FromArtifact(a manifest.Artifact) Target {
	return Target{Name: a.Name, URL: a.URL, Mirrors: a.Mirrors, Size: a.Size, SHA256: a.SHA256}
}

// source is one place a target is fetched from; mirror names it in
// events and errors: the URL's host (and port) only, never its path.
type source struct{ url, mirror string }

func (t Target) sources() []source {
	var out []source
	for _, raw := range append([]string{t.URL}, t.Mirrors...) {
		host := "?"
		if u, err := url.Parse(raw); err == nil {
			host = u.Host
		}
		out = append(out, source{url: raw, mirror: host})
	}
	return out
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (t Target) validate() error {
	if !hexRE.MatchString(t.SHA256) {
		return errors.New("sha256 must be 64 lowercase hex digits")
	}
	if t.Size < 1 || t.Size > manifest.MaxArtifactSize {
		return fmt.Errorf("size must be 1 to %d bytes", int64(manifest.MaxArtifactSize))
	}
	if err := manifest.CheckURL(t.URL); err != nil {
		return err
	}
	if len(t.Mirrors) > manifest.MaxMirrors {
		return fmt.Errorf("at most %d mirrors", manifest.MaxMirrors)
	}
	seen := map[string]bool{t.URL: true}
	for i, m := range t.Mirrors {
		if err := manifest.CheckURL(m); err != nil {
			return fmt.Errorf("mirror %d: %w", i, err)
		}
		if seen[m] {
			return fmt.Errorf("mirror %d: the same URL is listed twice", i)
		}
		seen[m] = true
	}
	return nil
}

// Result says how a target was staged.
type Result struct {
	// Path is STORE/sha256/HEX.
	Path string
	// Cached: the store had it already (verified).
	Cached bool
	// Shared: another stager downloaded it while this one waited.
	Shared bool
	// ResumedFrom is the partial file's size a resume started at (0: none).
	ResumedFrom int64
	// Repaired says what was wrong with a damaged file the store held
	// (it was removed and staged again); empty when nothing was.
	Repaired string
	// Downloaded counts the bytes received.
	Downloaded int64
	// Mirror is the host the last bytes came from (empty when nothing
	// was downloaded).
	Mirror string
	// Failed says how each mirror that failed before one served the
	// rest failed (each message names the mirror by its host).
	Failed []string
}

// Stager downloads pinned files into a content-addressed store:
// STORE/sha256/HEX holds verified files only; STORE/tmp holds partial
// downloads (HEX.partial) and locks (HEX.lock).
type Stager struct {
	Store string
	// Client is the HTTP client (default: one without an overall timeout;
	// the idle timeout bounds stalls).
	Client *http.Client
	// IdleTimeout fails a transfer that receives nothing for this long
	// (default 30s), from the request until the last byte.
	IdleTimeout time.Duration
	// Progress receives events (nil: none). It is called from the
	// staging goroutine.
	Progress func(Event)
	// ProgressInterval spaces progress events (default 200ms).
	ProgressInterval time.Duration
	// LockPoll is how often a waiting stager retries the lock (default
	// 50ms).
	LockPoll time.Duration
}

// Event kinds.
const (
	EventStart    = "start"    // a download begins (ResumedFrom set when it resumes)
	EventProgress = "progress" // bytes so far
	EventWait     = "wait"     // another stager holds the lock
	EventVerify   = "verify"   // hashing a file already present
	EventRetry    = "retry"    // a resumed file did not verify; starting over
	EventRepair   = "repair"   // a damaged file in the store (Error says how) was removed; staging it again
	EventMirror   = "mirror"   // Mirror failed (Code, Error say how); the next mirror is tried, resuming Bytes
	EventDone     = "done"     // the file is in the store
	EventError    = "error"    // staging failed; Error and Code say why
)

// Event is a progress report. It marshals to the JSON events oac-image
// stage prints when stderr is not a terminal.
type Event struct {
	Time        time.Time `json:"time"`
	Event       string    `json:"event"`
	Name        string    `json:"name"`
	SHA256      string    `json:"sha256"`
	Bytes       int64     `json:"bytes"`
	Total       int64     `json:"total"`
	ResumedFrom int64     `json:"resumed_from,omitempty"`
	Mirror      string    `json:"mirror,omitempty"`
	Next        string    `json:"next,omitempty"`
	Path        string    `json:"path,omitempty"`
	Cached      bool      `json:"cached,omitempty"`
	Shared      bool      `json:"shared,omitempty"`
	Code        string    `json:"code,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// Codes of a failure, as Code returns them and the error events carry.
const (
	CodeCorrupt   = "corrupt"
	CodeTruncated = "truncated"
	CodeWrongSize = "wrong_size"
	CodeHTTP      = "http"
	CodeStalled   = "stalled"
	CodeStore     = "store"
	CodeCanceled  = "canceled"
	CodeOther     = "other"
)

// CodeInfo describes one code for callers (schema/codes.json publishes
// this table; the TypeScript client generates its own from that file).
type CodeInfo struct {
	Code string
	// Retry: staging again, unchanged, may succeed (and resumes what was kept).
	Retry bool
	// Meaning says when it is given and what a caller should do.
	Meaning string
}

// Codes lists every code Code returns.
var Codes = []CodeInfo{
	{CodeCorrupt, false, "All the bytes arrived but their sha256 is not the pinned one; nothing was kept. The mirror serves other bytes: fix the mirror or the manifest."},
	{CodeTruncated, true, "The server ended the transfer early; the partial file is kept and the next stage resumes it."},
	{CodeWrongSize, false, "The server announced or sent a size other than the pinned one; nothing was kept. Fix the mirror or the manifest."},
	{CodeHTTP, true, "The server answered with an error status (the message says which): a 5xx may pass; a 404 means the URL is wrong."},
	{CodeStalled, true, "No byte arrived for the idle timeout; the partial file is kept and the next stage resumes it."},
	{CodeStore, false, "The store could not be written or locked: check its directory, its permissions and the free space."},
	{CodeCanceled, true, "Staging was canceled (a signal); the partial file is kept and the next stage resumes it."},
	{CodeOther, false, "Any other failure (the message says what): report it."},
}

// Code names an error for machines: one of Codes.
func Code(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrCorrupt):
		return CodeCorrupt
	case errors.Is(err, ErrTruncated):
		return CodeTruncated
	case errors.Is(err, ErrWrongSize):
		return CodeWrongSize
	case errors.Is(err, ErrHTTP):
		return CodeHTTP
	case errors.Is(err, ErrStalled):
		return CodeStalled
	case errors.Is(err, ErrStore):
		return CodeStore
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CodeCanceled
	}
	return CodeOther
}

func (s *Stager) emit(e Event) {
	if s.Progress != nil {
		e.Time = time.Now().UTC()
		s.Progress(e)
	}
}

func (s *Stager) idle() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return 30 * time.Second
}

func (s *Stager) client() *http.Client {
	if s.Client != nil {
		return s.Client
	}
	return http.DefaultClient
}

// Stage makes sure t is in the store and returns its path. The file is
// hashed while it streams, its size and sha256 are checked before an
// atomic rename into STORE/sha256/HEX, and nothing unverified is ever
// placed there. A partial file left by an interrupted or truncated
// transfer is resumed with an HTTP Range request, at the same mirror or
// the next (the whole file is verified at the end; a resumed file that
// does not verify is fetched once more from the start). Two stagers of the same digest, in one
// process or several, share one download through a lock file.
func (s *Stager) Stage(ctx context.Context, t Target) (res Result, err error) {
	if t.Name == "" {
		t.Name = t.SHA256
		if len(t.Name) > 12 {
			t.Name = t.Name[:12]
		}
	}
	defer func() {
		if err != nil {
			s.emit(Event{Event: EventError, Name: t.Name, SHA256: t.SHA256, Total: t.Size, Code: Code(err), Error: err.Error()})
		}
	}()
	if err := t.validate(); err != nil {
		return res, fmt.Errorf("stage %s: %w", t.Name, err)
	}
	final := manifest.StorePath(s.Store, t.SHA256)
	tmp := filepath.Join(s.Store, "tmp")
	for _, d := range []string{filepath.Dir(final), tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return res, fmt.Errorf("%w: %v", ErrStore, err)
		}
	}
	res.Path = final
	if ok, err := s.present(t, final, &res); err != nil || ok {
		res.Cached = ok
		if ok {
			s.emit(Event{Event: EventDone, Name: t.Name, SHA256: t.SHA256, Bytes: t.Size, Total: t.Size, Path: final, Cached: true})
		}
		return res, err
	}
	unlock, waited, err := s.lock(ctx, filepath.Join(tmp, t.SHA256+".lock"), t)
	if err != nil {
		return res, err
	}
	defer unlock()
	if waited {
		if ok, err := s.present(t, final, &res); err != nil || ok {
			res.Shared = ok
			if ok {
				s.emit(Event{Event: EventDone, Name: t.Name, SHA256: t.SHA256, Bytes: t.Size, Total: t.Size, Path: final, Shared: true})
			}
			return res, err
		}
	}
	partial := filepath.Join(tmp, t.SHA256+".partial")
	if err := s.fetchAll(ctx, t, partial, &res); err != nil {
		return res, fmt.Errorf("stage %s: %w", t.Name, err)
	}
	if err := place(partial, final); err != nil {
		return res, fmt.Errorf("stage %s: %w: %v", t.Name, ErrStore, err)
	}
	s.emit(Event{Event: EventDone, Name: t.Name, SHA256: t.SHA256, Bytes: t.Size, Total: t.Size, Path: final, ResumedFrom: res.ResumedFrom, Mirror: res.Mirror})
	return res, nil
}

// fetchAll fills partial from t's URL and then its mirrors, in order,
// until the whole file verifies. A mirror that fails leaves what it kept
// (a truncated or stalled transfer's bytes; a refusal's untouched prefix)
// for the next, which resumes it with a Range request; bytes are only
// ever accepted by the whole file's sha256. A file that does not verify
// is discarded: when its first bytes came from elsewhere (an earlier run
// or mirror) the same mirror is asked once more for all of it, so the
// mirror named as serving wrong bytes is one that sent every byte. The
// error is the last mirror's, with the earlier ones' after it.
func (s *Stager) fetchAll(ctx context.Context, t Target, partial string, res *Result) error {
	srcs := t.sources()
	var failed []error
	for i := 0; i < len(srcs); i++ {
		src := srcs[i]
		var r Result
		var err error
		for attempt := 0; ; attempt++ {
			r, err = s.download(ctx, t, src, partial)
			res.Downloaded += r.Downloaded
			if res.ResumedFrom == 0 {
				res.ResumedFrom = r.ResumedFrom
			}
			if err != nil && errors.Is(err, ErrCorrupt) && r.ResumedFrom > 0 && attempt == 0 {
				// The kept prefix may be what was wrong: once more from
				// the start.
				s.emit(Event{Event: EventRetry, Name: t.Name, SHA256: t.SHA256, Total: t.Size, Mirror: src.mirror, Error: err.Error()})
				continue
			}
			break
		}
		if err == nil {
			res.Mirror = src.mirror
			return nil
		}
		if errors.Is(err, ErrStore) || ctx.Err() != nil {
			return err
		}
		failed = append(failed, err)
		res.Failed = append(res.Failed, err.Error())
		if i+1 < len(srcs) {
			s.emit(Event{Event: EventMirror, Name: t.Name, SHA256: t.SHA256, Bytes: partialSize(partial), Total: t.Size,
				Mirror: src.mirror, Next: srcs[i+1].mirror, Code: Code(err), Error: err.Error()})
		}
	}
	last := failed[len(failed)-1]
	if len(failed) == 1 {
		return last
	}
	return &mirrorsError{last: last, earlier: failed[:len(failed)-1]}
}

// mirrorsError is the last mirror's failure (what errors.Is sees, so the
// code is the last mirror's, and says what became of the partial file)
// with the earlier mirrors' after it.
type mirrorsError struct {
	last    error
	earlier []error
}

func (e *mirrorsError) Error() string {
	parts := make([]string, len(e.earlier))
	for i, err := range e.earlier {
		parts[i] = err.Error()
	}
	return e.last.Error() + " (every mirror failed; before it: " + strings.Join(parts, "; ") + ")"
}

func (e *mirrorsError) Unwrap() error { return e.last }

func partialSize(p string) int64 {
	if st, err := os.Stat(p); err == nil {
		return st.Size()
	}
	return 0
}

// present reports whether final exists and verifies. A file that does not
// verify is removed (the store only holds verified files, so it was
// damaged after staging), said so in a repair event and in res, and
// staged again.
func (s *Stager) present(t Target, final string, res *Result) (bool, error) {
	st, err := os.Stat(final)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrStore, err)
	}
	s.emit(Event{Event: EventVerify, Name: t.Name, SHA256: t.SHA256, Total: t.Size, Path: final})
	a := manifest.Artifact{Name: t.Name, Size: t.Size, SHA256: t.SHA256}
	var bad error
	if !st.Mode().IsRegular() {
		bad = errors.New("not a regular file")
	} else {
		bad = manifest.VerifyFile(a, final)
	}
	if bad == nil {
		return true, nil
	}
	if err := os.Remove(final); err != nil {
		return false, fmt.Errorf("%w: remove damaged %s (%v): %v", ErrStore, final, bad, err)
	}
	res.Repaired = bad.Error()
	s.emit(Event{Event: EventRepair, Name: t.Name, SHA256: t.SHA256, Total: t.Size, Path: final,
		Error: "the staged file was damaged (" + bad.Error() + "): removed it; staging it again"})
	return false, nil
}

// lock takes the digest's lock, waiting (and saying so once) while
// another stager holds it. The lock file is removed when it is released,
// so none stays in the store; a lock won on a file that its holder
// removed meanwhile is not the lock at the path, and is taken again.
func (s *Stager) lock(ctx context.Context, p string, t Target) (func(), bool, error) {
	poll := s.LockPoll
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	waited := false
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrStore, err)
		}
		for {
			ok, err := tryLock(f)
			if err != nil {
				f.Close()
				return nil, false, fmt.Errorf("%w: lock %s: %v", ErrStore, p, err)
			}
			if ok {
				break
			}
			if !waited {
				waited = true
				s.emit(Event{Event: EventWait, Name: t.Name, SHA256: t.SHA256, Total: t.Size})
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, false, context.Cause(ctx)
			case <-time.After(poll):
			}
		}
		if held, err := f.Stat(); err == nil {
			if cur, err := os.Stat(p); err == nil && os.SameFile(held, cur) {
				return func() { _ = os.Remove(p); unlockFile(f); f.Close() }, waited, nil
			}
		}
		unlockFile(f)
		f.Close()
	}
}

// place moves a verified partial file into the store: read-only, synced,
// renamed atomically, the directory synced.
func place(partial, final string) error {
	if err := os.Chmod(partial, 0o444); err != nil {
		return err
	}
	if err := os.Rename(partial, final); err != nil {
		return err
	}
	return syncDir(filepath.Dir(final))
}

// download fetches t from src into partial, resuming what is there, and
// verifies the whole file. On ErrTruncated and ErrStalled the partial
// file stays for the next attempt; so does a prefix the mirror refused
// before sending a byte (an error status, another size, no answer): it
// did not touch it. On any other error it is removed.
func (s *Stager) download(ctx context.Context, t Target, src source, partial string) (res Result, err error) {
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return res, fmt.Errorf("%w: %v", ErrStore, err)
	}
	keep := false
	defer func() {
		f.Close()
		if err != nil && !keep {
			os.Remove(partial)
		}
	}()
	h := sha256.New()
	have, err := io.Copy(h, f) // the kept prefix, hashed again
	if err != nil {
		return res, fmt.Errorf("%w: read partial file: %v", ErrStore, err)
	}
	if have >= t.Size {
		// Too long, or complete but never verified: start over.
		have, h = 0, sha256.New()
		if err := f.Truncate(0); err != nil {
			return res, fmt.Errorf("%w: %v", ErrStore, err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return res, fmt.Errorf("%w: %v", ErrStore, err)
		}
	}
	n, resumed, refused, err := s.fetch(ctx, t, src, f, h, have)
	res.Downloaded, res.ResumedFrom = n, resumed
	if err != nil {
		keep = errors.Is(err, ErrTruncated) || errors.Is(err, ErrStalled) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
			(refused && have > 0)
		return res, err
	}
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("%w: %v", ErrStore, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != t.SHA256 {
		what := fmt.Sprintf("mirror %s served other bytes or they were damaged in transit", src.mirror)
		if resumed > 0 {
			what = fmt.Sprintf("mirror %s served bytes %d to %d, resuming a file begun earlier; one of them was wrong", src.mirror, resumed, t.Size)
		}
		return res, fmt.Errorf("%w (got %s, want %s): %s; the partial file was discarded and nothing was placed", ErrCorrupt, got, t.SHA256, what)
	}
	return res, nil
}

// fetch requests t from src at offset have (a Range request when have >
// 0) and appends what arrives to f and h. It returns the bytes received,
// the offset it resumed from, and whether the mirror refused before f
// was touched (an error status, a size or range other than the pin's, no
// answer). Errors name the mirror by its host only.
func (s *Stager) fetch(ctx context.Context, t Target, src source, f *os.File, h hash.Hash, have int64) (int64, int64, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := newWatchdog(s.idle(), cancel)
	defer w.stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.url, nil)
	if err != nil {
		return 0, 0, true, fmt.Errorf("mirror %s: %w", src.mirror, err)
	}
	req.Header.Set("Accept-Encoding", "identity")
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := s.client().Do(req)
	if err != nil {
		if w.fired() {
			return 0, 0, false, fmt.Errorf("%w: no response from mirror %s within the idle timeout of %s", ErrStalled, src.mirror, s.idle())
		}
		if ctx.Err() != nil {
			return 0, 0, false, context.Cause(ctx)
		}
		// net/http's error quotes the whole URL: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, 0, true, fmt.Errorf("mirror %s: request failed: %w", src.mirror, err)
	}
	defer resp.Body.Close()
	w.kick()
	start := have
	switch {
	case resp.StatusCode == http.StatusPartialContent && have > 0:
		from, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || from != have {
			return 0, 0, true, fmt.Errorf("%w: mirror %s answered the range request with an unusable Content-Range", ErrWrongSize, src.mirror)
		}
		if total >= 0 && total != t.Size {
			return 0, 0, true, fmt.Errorf("%w: mirror %s has %d bytes, the pin says %d", ErrWrongSize, src.mirror, total, t.Size)
		}
	case resp.StatusCode == http.StatusOK:
		// A server that ignores ranges sends everything: start over.
		start = 0
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && have > 0:
		// The kept prefix is longer than what the server has.
		return 0, 0, true, fmt.Errorf("%w: mirror %s refused to resume at byte %d (416): it has fewer bytes than the pin says", ErrWrongSize, src.mirror, have)
	default:
		return 0, 0, true, fmt.Errorf("%w", &HTTPError{Mirror: src.mirror, Status: resp.StatusCode, Text: http.StatusText(resp.StatusCode)})
	}
	if resp.ContentLength >= 0 && start+resp.ContentLength != t.Size {
		return 0, 0, true, fmt.Errorf("%w: mirror %s announces %d bytes, the pin says %d", ErrWrongSize, src.mirror, start+resp.ContentLength, t.Size)
	}
	if start == 0 && have > 0 {
		h.Reset()
		if err := f.Truncate(0); err != nil {
			return 0, 0, false, fmt.Errorf("%w: %v", ErrStore, err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return 0, 0, false, fmt.Errorf("%w: %v", ErrStore, err)
		}
	}
	resumedFrom := start
	if start > 0 || have > 0 {
		s.emit(Event{Event: EventStart, Name: t.Name, SHA256: t.SHA256, Bytes: start, Total: t.Size, ResumedFrom: resumedFrom, Mirror: src.mirror})
	} else {
		s.emit(Event{Event: EventStart, Name: t.Name, SHA256: t.SHA256, Total: t.Size, Mirror: src.mirror})
	}
	got := start
	buf := make([]byte, 256<<10)
	interval := s.ProgressInterval
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	last := time.Now()
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			w.kick()
			if got+int64(n) > t.Size {
				return got - start, resumedFrom, false, fmt.Errorf("%w: mirror %s sent more than the pinned %d bytes", ErrWrongSize, src.mirror, t.Size)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return got - start, resumedFrom, false, fmt.Errorf("%w: %v", ErrStore, err)
			}
			h.Write(buf[:n])
			got += int64(n)
			if time.Since(last) >= interval {
				last = time.Now()
				s.emit(Event{Event: EventProgress, Name: t.Name, SHA256: t.SHA256, Bytes: got, Total: t.Size, ResumedFrom: resumedFrom, Mirror: src.mirror})
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if w.fired() {
				return got - start, resumedFrom, false, fmt.Errorf("%w: nothing received for %s after %d of %d bytes from mirror %s; the partial file is kept and the next attempt resumes it", ErrStalled, s.idle(), got, t.Size, src.mirror)
			}
			if ctx.Err() != nil {
				return got - start, resumedFrom, false, context.Cause(ctx)
			}
			return got - start, resumedFrom, false, fmt.Errorf("%w: the connection to mirror %s ended after %d of %d bytes (%v); the partial file is kept and the next attempt resumes it", ErrTruncated, src.mirror, got, t.Size, rerr)
		}
	}
	if got < t.Size {
		return got - start, resumedFrom, false, fmt.Errorf("%w: mirror %s sent %d of %d bytes; the partial file is kept and the next attempt resumes it", ErrTruncated, src.mirror, got, t.Size)
	}
	s.emit(Event{Event: EventProgress, Name: t.Name, SHA256: t.SHA256, Bytes: got, Total: t.Size, ResumedFrom: resumedFrom, Mirror: src.mirror})
	return got - start, resumedFrom, false, nil
}

// parseContentRange parses "bytes FROM-TO/TOTAL" (TOTAL may be "*", -1).
func parseContentRange(v string) (from, total int64, ok bool) {
	rest, found := strings.CutPrefix(v, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	from, err1 := strconv.ParseInt(a, 10, 64)
	to, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || from < 0 || to < from {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t <= to {
			return 0, 0, false
		}
		total = t
	}
	return from, total, true
}

// watchdog cancels a transfer when kick is not called for d.
type watchdog struct {
	mu    sync.Mutex
	timer *time.Timer
	d     time.Duration
	fire  bool
}

func newWatchdog(d time.Duration, cancel func()) *watchdog {
	w := &watchdog{d: d}
	w.timer = time.AfterFunc(d, func() {
		w.mu.Lock()
		w.fire = true
		w.mu.Unlock()
		cancel()
	})
	return w
}

func (w *watchdog) kick() { w.timer.Reset(w.d) }
func (w *watchdog) stop() { w.timer.Stop() }
func (w *watchdog) fired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fire
}
