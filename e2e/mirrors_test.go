//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/manifest"
)

// mirror is a loopback server holding one directory's files, served in
// one way: "good", "corrupt" (one byte flipped in the second half, ranges
// honoured: a mirror holding other bytes under the same name), "truncate"
// (a whole-file request gets the whole size announced and half the bytes,
// then the connection is cut; a range request is served) or "gone" (410).
type mirror struct {
	*httptest.Server
	host   string
	gets   atomic.Int32
	ranges atomic.Int32
}

func newMirror(t *testing.T, dir, mode string) *mirror {
	m := &mirror{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.gets.Add(1)
		if r.Header.Get("Range") != "" {
			m.ranges.Add(1)
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.Base(r.URL.Path)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		switch mode {
		case "good":
		case "corrupt":
			b = append([]byte(nil), b...)
			b[len(b)*3/4] ^= 0xff
		case "truncate":
			if r.Header.Get("Range") == "" {
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				_, _ = w.Write(b[:len(b)/2])
				w.(http.Flusher).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
				return
			}
		case "gone":
			http.Error(w, "gone", http.StatusGone)
			return
		}
		http.ServeContent(w, r, "f", time.Unix(0, 0), bytes.NewReader(b))
	}))
	t.Cleanup(m.Close)
	m.host = strings.TrimPrefix(m.URL, "http://")
	return m
}

// runStage runs the real oac-image stage and returns its exit status,
// stdout and stderr.
func runStage(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bins.image, append([]string{"stage"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "%v", err)
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	return 0, stdout.String(), stderr.String()
}

// stageEvents parses oac-image stage's JSON progress lines.
func stageEvents(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &e), "not a JSON event: %q", line)
		out = append(out, e)
	}
	return out
}

func eventsOf(evs []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, e := range evs {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// pinRootfs writes a manifest pinning the tarball at the first mirror and
// the others, in order.
func pinRootfs(t *testing.T, tarball string, mirrors ...*mirror) (string, manifest.Artifact) {
	t.Helper()
	st, err := os.Stat(tarball)
	require.NoError(t, err)
	sum, err := exec.Command("sha256sum", tarball).Output()
	require.NoError(t, err)
	a := manifest.Artifact{Name: "rootfs-tar-windows-amd64", Kind: manifest.KindRootfsTar, Platform: "windows", Arch: "amd64",
		URL: mirrors[0].URL + "/rootfs.tar.gz", Size: st.Size(), SHA256: strings.Fields(string(sum))[0]}
	for _, m := range mirrors[1:] {
		a.Mirrors = append(a.Mirrors, m.URL+"/rootfs.tar.gz")
	}
	var b bytes.Buffer
	require.NoError(t, manifest.Encode(&manifest.Manifest{Schema: manifest.SchemaVersion, Release: "e2e-1", Artifacts: []manifest.Artifact{a}}, &b))
	p := filepath.Join(t.TempDir(), "manifest.json")
	require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
	return p, a
}

// The run's guest image is staged from two loopback mirrors, one serving
// other bytes under the same name, by the real oac-image stage, and the
// staged tarball boots (the wsl provider against the fake wsl.exe).
func TestStageFromMirrorsNamesTheCorruptOneResumesAcrossThemAndTheResultBoots(t *testing.T) {
	needImageBuild(t)
	needRootForState(t)
	tarball := guestImage(t)
	dir := filepath.Dir(tarball)
	partial := func(store, sum string) (int64, bool) {
		st, err := os.Stat(filepath.Join(store, "tmp", sum+".partial"))
		if err != nil {
			return 0, false
		}
		return st.Size(), true
	}

	t.Run("a corrupt mirror is named, nothing of it is kept, the next serves the file", func(t *testing.T) {
		bad, good := newMirror(t, dir, "corrupt"), newMirror(t, dir, "good")
		mf, art := pinRootfs(t, tarball, bad, good)
		store := t.TempDir()
		code, stdout, stderr := runStage(t, "--store", store, "--manifest", mf, "--progress", "json")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, art.Name+" "+manifest.StorePath(store, art.SHA256)+"\n", stdout)
		evs := stageEvents(t, stderr)
		failed := eventsOf(evs, "mirror")
		require.Len(t, failed, 1, stderr)
		assert.Equal(t, bad.host, failed[0]["mirror"])
		assert.Equal(t, good.host, failed[0]["next"])
		assert.Equal(t, "corrupt", failed[0]["code"])
		assert.Contains(t, failed[0]["error"], "mirror "+bad.host+" served other bytes")
		assert.EqualValues(t, 0, failed[0]["bytes"], "the corrupt bytes were discarded")
		done := eventsOf(evs, "done")
		require.Len(t, done, 1)
		assert.Equal(t, good.host, done[0]["mirror"])
		assert.Equal(t, int32(0), good.ranges.Load(), "the good mirror sent the whole file: nothing of the corrupt one was resumed")
		assert.NoError(t, manifest.VerifyFile(art, manifest.StorePath(store, art.SHA256)))
		_, kept := partial(store, art.SHA256)
		assert.False(t, kept)
		assert.NotContains(t, stderr, "rootfs.tar.gz", "mirrors are named by host, never by URL")

		t.Run("the staged tarball boots", func(t *testing.T) {
			w := newWSLDistro(t)
			w.rootfs = manifest.StorePath(store, art.SHA256)
			name := uniqueName("e2e")
			s := startShim(t, sandboxSpec{provider: "wsl", name: name, env: w.env, args: w.args(), bootstrap: standinDaemon(name)})
			s.waitState(api.StateReady, bootTimeout)
			assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", bootTimeout))
			s.signal(syscall.SIGTERM)
			assert.Equal(t, 0, s.exit(15*time.Second))
			assert.Contains(t, w.calls(t), "--import oac-"+s.name+" "+filepath.Join("/run/oac/sandboxes", s.name, "distro")+" "+w.rootfs+" --version 2")
		})
	})

	t.Run("only a corrupt mirror: exit 1, the mirror named, nothing placed or kept", func(t *testing.T) {
		bad, gone := newMirror(t, dir, "corrupt"), newMirror(t, dir, "gone")
		mf, art := pinRootfs(t, tarball, gone, bad)
		store := t.TempDir()
		code, _, stderr := runStage(t, "--store", store, "--manifest", mf, "--quiet")
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "oac-image: corrupt: stage "+art.Name+": download corrupted: sha256 does not match the pin")
		assert.Contains(t, stderr, "mirror "+bad.host+" served other bytes")
		assert.Contains(t, stderr, "mirror "+gone.host+" answered 410 Gone", "every mirror's failure is said")
		_, err := os.Stat(manifest.StorePath(store, art.SHA256))
		assert.ErrorIs(t, err, os.ErrNotExist, "the store never holds the corrupt bytes")
		_, kept := partial(store, art.SHA256)
		assert.False(t, kept)
	})

	t.Run("a transfer cut at one mirror resumes at the next with a Range request", func(t *testing.T) {
		cut, good := newMirror(t, dir, "truncate"), newMirror(t, dir, "good")
		mf, art := pinRootfs(t, tarball, cut, good)
		store := t.TempDir()
		code, _, stderr := runStage(t, "--store", store, "--manifest", mf, "--progress", "json")
		require.Equal(t, 0, code, stderr)
		evs := stageEvents(t, stderr)
		failed := eventsOf(evs, "mirror")
		require.Len(t, failed, 1, stderr)
		assert.Equal(t, "truncated", failed[0]["code"])
		assert.EqualValues(t, art.Size/2, failed[0]["bytes"], "the half it sent is kept for the next mirror")
		starts := eventsOf(evs, "start")
		require.Len(t, starts, 2)
		assert.Equal(t, good.host, starts[1]["mirror"])
		assert.EqualValues(t, art.Size/2, starts[1]["resumed_from"])
		assert.Equal(t, int32(1), good.ranges.Load())
		assert.Equal(t, int32(1), good.gets.Load(), "only the rest was asked for")
		assert.NoError(t, manifest.VerifyFile(art, manifest.StorePath(store, art.SHA256)))
	})

	t.Run("a prefix from one mirror that the corrupt one finishes is fetched whole again and the corrupt one named", func(t *testing.T) {
		cut, bad, good := newMirror(t, dir, "truncate"), newMirror(t, dir, "corrupt"), newMirror(t, dir, "good")
		mf, art := pinRootfs(t, tarball, cut, bad, good)
		store := t.TempDir()
		code, _, stderr := runStage(t, "--store", store, "--manifest", mf, "--progress", "json")
		require.Equal(t, 0, code, stderr)
		evs := stageEvents(t, stderr)
		require.Len(t, eventsOf(evs, "retry"), 1, "the resumed file did not verify: the corrupt mirror is asked for all of it")
		failed := eventsOf(evs, "mirror")
		require.Len(t, failed, 2, stderr)
		assert.Equal(t, cut.host, failed[0]["mirror"])
		assert.Equal(t, bad.host, failed[1]["mirror"])
		assert.Equal(t, "corrupt", failed[1]["code"])
		assert.Contains(t, failed[1]["error"], "mirror "+bad.host+" served other bytes")
		assert.Equal(t, int32(0), good.ranges.Load(), "the good mirror sent everything")
		assert.NoError(t, manifest.VerifyFile(art, manifest.StorePath(store, art.SHA256)))
	})
}
