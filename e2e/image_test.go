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
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/manifest"
)

// needImageTools checks what oac-image build needs for every output.
func needImageTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "debugfs", "dumpe2fs", "e2fsck"} {
		_, err := exec.LookPath(tool)
		need(t, err == nil, tool+" is not installed: apt-get install e2fsprogs (or run make deps)")
	}
	for _, tool := range []string{"mkfs.erofs", "fsck.erofs"} {
		_, err := exec.LookPath(tool)
		need(t, err == nil, tool+" is not installed: apt-get install erofs-utils (or run make deps)")
	}
	_, err := exec.LookPath("tar")
	need(t, err == nil, "tar is not installed")
	need(t, os.Geteuid() == 0, "image outputs with owners 0 and 1000 (dir, ext4, erofs) are written as root: run the e2e tests as root (sudo make test)")
	_, err = os.Stat(filepath.Join(kernelCache(), "modules", "modules.dep"))
	need(t, err == nil, "no kernel cache at "+kernelCache()+": run make kernel")
}

// testBaseRootfs synthesizes a tiny base: the static vmdaemon as the
// guest's daemon, an os-release, a merged /usr.
func testBaseRootfs(t *testing.T) string {
	t.Helper()
	base := filepath.Join(t.TempDir(), "base")
	require.NoError(t, os.MkdirAll(filepath.Join(base, "usr/bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(base, "usr/sbin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(base, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(base, "etc/os-release"), []byte("ID=oac-e2e\n"), 0o644))
	b, err := os.ReadFile(bins.vmdaemon)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(base, "usr/bin/vmdaemon"), b, 0o755))
	require.NoError(t, os.Symlink("usr/sbin", filepath.Join(base, "sbin")))
	require.NoError(t, os.Symlink("usr/bin", filepath.Join(base, "bin")))
	return base
}

// stageServer serves a build's output directory under several behaviours,
// one per path prefix, and counts GET requests per path.
type stageServer struct {
	*httptest.Server
	dir   string
	mu    sync.Mutex
	gets  map[string]int
	stall chan struct{}
}

func (s *stageServer) count(p string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[p]
}

func newStageServer(t *testing.T) *stageServer {
	s := &stageServer{gets: map[string]int{}, stall: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		mode, name, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		b, err := os.ReadFile(filepath.Join(s.dir, filepath.Base(name)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		switch mode {
		case "good":
		case "slow": // the same bytes, paced, so a second stager must wait
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			for i := 0; i < len(b); i += len(b)/10 + 1 {
				_, _ = w.Write(b[i:min(i+len(b)/10+1, len(b))])
				w.(http.Flusher).Flush()
				time.Sleep(30 * time.Millisecond)
			}
			return
		case "corrupt":
			b = append([]byte(nil), b...)
			b[len(b)/2] ^= 0xff
		case "short":
			b = b[:len(b)-1]
		case "truncate": // the whole file announced, half sent, unless resuming
			if r.Header.Get("Range") == "" {
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				_, _ = w.Write(b[:len(b)/2])
				w.(http.Flusher).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
				return
			}
		case "stall":
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			_, _ = w.Write(b[:1024])
			w.(http.Flusher).Flush()
			select {
			case <-s.stall:
			case <-r.Context().Done():
			}
			return
		case "gone":
			http.Error(w, "gone", http.StatusGone)
			return
		default:
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, name, time.Unix(0, 0), bytes.NewReader(b))
	}))
	t.Cleanup(func() { close(s.stall); s.Close() })
	return s
}

// buildImage runs oac-image build with every output into a new directory.
func buildImage(t *testing.T, base, sandboxIO, baseURL string) (string, string) {
	t.Helper()
	// The bwrap provider opens the rootfs as the guest's root id, which
	// must be able to search every parent: t.TempDir is 0700.
	parent, err := os.MkdirTemp("", "oac-e2e-image-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(parent) })
	require.NoError(t, os.Chmod(parent, 0o755))
	out := filepath.Join(parent, "out")
	cache := kernelCache()
	cmd := exec.Command(bins.image, "build", "--base", base, "--agent", bins.guest, "--sandbox-io", sandboxIO,
		"--kernel", filepath.Join(cache, "vmlinuz"), "--kernel-modules", filepath.Join(cache, "modules"),
		"--initramfs-file", bins.vmdaemon+":"+vmDaemon, "--base-url", baseURL, "--release", "e2e-1", "-o", out)
	// No epoch given: reproducible is the default.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	begin := time.Now()
	require.NoError(t, cmd.Run(), "oac-image build: %s", stderr.String())
	t.Logf("oac-image build in %s:\n%s", time.Since(begin).Round(time.Millisecond), stderr.String())
	return out, stderr.String()
}

func TestImageBuildEveryOutputTwiceBootAndStage(t *testing.T) {
	needImageTools(t)
	srv := newStageServer(t)
	base := testBaseRootfs(t)
	// oac-sandbox-io is another project's binary; a static stand-in.
	sandboxIO := bins.badGarbage

	out1, _ := buildImage(t, base, sandboxIO, srv.URL+"/good")
	out2, _ := buildImage(t, base, sandboxIO, srv.URL+"/good")
	srv.dir = out1
	sums1, err := os.ReadFile(filepath.Join(out1, imagebuild.SumsName))
	require.NoError(t, err)
	sums2, err := os.ReadFile(filepath.Join(out2, imagebuild.SumsName))
	require.NoError(t, err)
	assert.Equal(t, string(sums1), string(sums2), "two builds of the same inputs, no epoch given, give the same digests")
	for _, name := range []string{"rootfs.tar.gz", "oci/index.json", "oci/oci-layout", "disk.ext4", "disk.erofs", "vmlinuz", "initramfs.img"} {
		assert.Contains(t, string(sums1), "  "+name+"\n", "every output is built and listed")
	}
	check := exec.Command("sha256sum", "--strict", "-c", imagebuild.SumsName)
	check.Dir = out1
	checked, err := check.CombinedOutput()
	require.NoError(t, err, "sha256sum -c SHA256SUMS: %s", checked)
	assert.NotContains(t, string(checked), "FAILED")
	for _, f := range []string{imagebuild.TarName, imagebuild.Ext4Name, imagebuild.ErofsName, imagebuild.InitramfsName, imagebuild.ManifestName} {
		a, err := os.ReadFile(filepath.Join(out1, f))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(out2, f))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(a, b), "%s is bit-identical", f)
	}

	t.Run("real tools read every output back", func(t *testing.T) {
		listing, err := exec.Command("tar", "-tvzf", filepath.Join(out1, imagebuild.TarName)).CombinedOutput()
		require.NoError(t, err, "%s", listing)
		assert.Regexp(t, `drwx------ 1000/1000 +0 1970-01-01 00:00 home/runtime/\n`, string(listing), "every time is the default epoch, 0")
		assert.Regexp(t, `-rwxr-xr-x 0/0 .* usr/sbin/oac-guest\n`, string(listing), "/sbin is usr/sbin in the base")
		assert.Contains(t, string(listing), "usr/local/bin/oac-sandbox-io\n")
		assert.Contains(t, string(listing), "etc/ssl/certs/ca-certificates.crt\n")
		assert.Regexp(t, `drwxr-xr-x 1000/1000 .* environment/workspace/\n`, string(listing))

		fsck, err := exec.Command("e2fsck", "-fn", filepath.Join(out1, imagebuild.Ext4Name)).CombinedOutput()
		require.NoError(t, err, "%s", fsck)
		stat, err := exec.Command("debugfs", "-R", "stat /home/runtime", filepath.Join(out1, imagebuild.Ext4Name)).CombinedOutput()
		require.NoError(t, err, "%s", stat)
		assert.Regexp(t, `Mode: +0700`, string(stat))
		assert.Regexp(t, `User: +1000 +Group: +1000`, string(stat))
		assert.Contains(t, string(stat), "ctime: 0x00000000:00000000", "every time is the epoch")
		sb, err := exec.Command("dumpe2fs", "-h", filepath.Join(out1, imagebuild.Ext4Name)).CombinedOutput()
		require.NoError(t, err, "%s", sb)
		assert.Contains(t, string(sb), "Filesystem created:       Thu Jan  1 00:00:01 1970",
			"the superblock's times are the epoch's first second (e2fsprogs reads a fake time of 0 as none)")

		ex := filepath.Join(t.TempDir(), "erofs")
		fsck, err = exec.Command("fsck.erofs", "--extract="+ex, filepath.Join(out1, imagebuild.ErofsName)).CombinedOutput()
		require.NoError(t, err, "%s", fsck)
		st, err := os.Stat(filepath.Join(ex, "usr/bin/vmdaemon"))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())

		img, err := imagebuild.ReadOCILayout(filepath.Join(out1, imagebuild.OCIName))
		require.NoError(t, err)
		assert.Equal(t, "latest", img.Ref)
		assert.Equal(t, "linux", img.OS)
		assert.Equal(t, []string{imagebuild.AgentPath}, img.Entrypoint)

		verify, err := exec.Command(bins.image, "manifest", "verify", filepath.Join(out1, imagebuild.ManifestName), "--dir", out1).CombinedOutput()
		require.NoError(t, err, "%s", verify)
		assert.Contains(t, string(verify), "rootfs-tar-windows-amd64")
		assert.NotContains(t, string(verify), "FAIL")
	})

	t.Run("the directory boots in bwrap", func(t *testing.T) {
		needBwrap(t)
		s := startShim(t, sandboxSpec{
			bootstrap: `{"version":1,"hostname":"imgdir","daemon":{"argv":["/usr/bin/vmdaemon"]}}`,
			args:      []string{"--rootfs", filepath.Join(out1, imagebuild.DirName)},
		})
		s.waitState(api.StateReady, bootTimeout)
		assert.Equal(t, "uid=1000 gid=1000 groups=", s.waitLog("ids=", 10*time.Second))
		assert.Equal(t, "oac-guest", s.waitLog("pid1=", 5*time.Second))
		assert.Equal(t, imagebuild.Workspace, s.waitLog("cwd=", 5*time.Second), "the image's workspace is the daemon's directory")
		s.signal(syscall.SIGTERM)
		assert.Equal(t, 0, s.exit(15*time.Second))
	})

	t.Run("kernel, initramfs and disk boot in qemu", func(t *testing.T) {
		needVM(t)
		disk := filepath.Join(out1, imagebuild.Ext4Name)
		name := uniqueName("vmdisk")
		s := startShim(t, sandboxSpec{
			provider: "qemu", name: name, bootstrap: vmBootstrap(name),
			args: []string{"--kernel", filepath.Join(out1, imagebuild.KernelName), "--initramfs", filepath.Join(out1, imagebuild.InitramfsName),
				"--disk", disk, "--boot-timeout", vmBootTimeout.String(), "--host-grace", vmHostGrace.String()},
		})
		ready := s.waitState(api.StateReady, vmBootTimeout)
		t.Logf("built image: boot to ready under qemu: %s", bootTime(t, ready))
		assert.Equal(t, "uid=1000 gid=1000 groups=", s.waitLog("ids=", 10*time.Second))
		assert.Equal(t, "ext4 ro", s.waitLog("root=", 10*time.Second), "the guest's root is the built disk, read-only")
		s.signal(syscall.SIGTERM)
		assert.Equal(t, 0, s.exit(20*time.Second))
	})

	t.Run("staging", func(t *testing.T) {
		f, err := os.Open(filepath.Join(out1, imagebuild.ManifestName))
		require.NoError(t, err)
		m, err := manifest.Decode(f)
		f.Close()
		require.NoError(t, err)
		tarArt := m.Find("", manifest.KindRootfsTar, "windows", "amd64")
		require.Len(t, tarArt, 1)
		art := tarArt[0]
		stageCmd := func(store string, extra ...string) (int, string, string) {
			cmd := exec.Command(bins.image, append([]string{"stage", "--store", store}, extra...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if err != nil {
				ee, ok := err.(*exec.ExitError)
				require.True(t, ok, "%v", err)
				code = ee.ExitCode()
			}
			return code, stdout.String(), stderr.String()
		}
		single := func(mode string) []string {
			return []string{"--url", srv.URL + "/" + mode + "/" + art.FileName(), "--size", fmt.Sprint(art.Size), "--sha256", art.SHA256, "--name", "rootfs"}
		}
		placed := func(store string) bool {
			_, err := os.Stat(manifest.StorePath(store, art.SHA256))
			return err == nil
		}
		partial := func(store string) int64 {
			st, err := os.Stat(filepath.Join(store, "tmp", art.SHA256+".partial"))
			if err != nil {
				return -1
			}
			return st.Size()
		}

		t.Run("a manifest's linux artifacts, with JSON progress", func(t *testing.T) {
			store := t.TempDir()
			code, stdout, stderr := stageCmd(store, "--manifest", filepath.Join(out1, imagebuild.ManifestName), "--platform", "linux")
			require.Equal(t, 0, code, stderr)
			assert.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 4, "disk-ext4, disk-erofs, kernel, initramfs for linux")
			var kinds []string
			for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
				var e map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &e), "not a JSON event: %q", line)
				kinds = append(kinds, e["event"].(string))
			}
			assert.Contains(t, kinds, "progress")
			assert.Contains(t, kinds, "done")
			verify, err := exec.Command(bins.image, "manifest", "verify", filepath.Join(out1, imagebuild.ManifestName), "--store", store).CombinedOutput()
			assert.Error(t, err, "the windows tar was not staged")
			assert.Contains(t, string(verify), "disk-ext4-linux-amd64            ok")
		})
		t.Run("quiet", func(t *testing.T) {
			store := t.TempDir()
			code, stdout, stderr := stageCmd(store, append(single("good"), "--quiet")...)
			require.Equal(t, 0, code, stderr)
			assert.Empty(t, stderr)
			assert.Equal(t, "rootfs "+manifest.StorePath(store, art.SHA256)+"\n", stdout)
		})
		t.Run("corrupt", func(t *testing.T) {
			store := t.TempDir()
			code, _, stderr := stageCmd(store, append(single("corrupt"), "--quiet")...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, "oac-image: corrupt: stage rootfs: download corrupted: sha256 does not match the pin")
			assert.False(t, placed(store))
			assert.Equal(t, int64(-1), partial(store), "a corrupt download is not kept")
		})
		t.Run("truncated, then resumed", func(t *testing.T) {
			store := t.TempDir()
			code, _, stderr := stageCmd(store, append(single("truncate"), "--quiet")...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, "oac-image: truncated: stage rootfs: download truncated")
			assert.False(t, placed(store))
			assert.Equal(t, art.Size/2, partial(store), "the received half is kept")
			code, _, stderr = stageCmd(store, single("truncate")...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stderr, fmt.Sprintf(`"resumed_from":%d`, art.Size/2))
			assert.True(t, placed(store))
			assert.NoError(t, manifest.VerifyFile(art, manifest.StorePath(store, art.SHA256)))
		})
		t.Run("wrong size", func(t *testing.T) {
			store := t.TempDir()
			code, _, stderr := stageCmd(store, append(single("short"), "--quiet")...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, "oac-image: wrong_size: stage rootfs: wrong size: mirror "+strings.TrimPrefix(srv.URL, "http://")+" announces")
			assert.False(t, placed(store))
		})
		t.Run("HTTP error", func(t *testing.T) {
			store := t.TempDir()
			code, _, stderr := stageCmd(store, append(single("gone"), "--quiet")...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, "oac-image: http: stage rootfs: mirror "+strings.TrimPrefix(srv.URL, "http://")+" answered 410 Gone")
			assert.False(t, placed(store))
		})
		t.Run("stalled", func(t *testing.T) {
			store := t.TempDir()
			begin := time.Now()
			code, _, stderr := stageCmd(store, append(single("stall"), "--quiet", "--idle-timeout", "500ms")...)
			assert.Equal(t, 1, code)
			assert.Less(t, time.Since(begin), 10*time.Second)
			assert.Contains(t, stderr, "oac-image: stalled: stage rootfs: download stalled: nothing received for 500ms after 1024 of")
			assert.False(t, placed(store))
			assert.Equal(t, int64(1024), partial(store))
		})
		t.Run("two stagers share one download", func(t *testing.T) {
			store := t.TempDir()
			path := "/slow/" + art.FileName()
			before := srv.count(path)
			var wg sync.WaitGroup
			var codes [2]int
			var errs [2]string
			var shared atomic.Int32
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var stderr string
					codes[i], _, stderr = stageCmd(store, single("slow")...)
					errs[i] = stderr
					if strings.Contains(stderr, `"shared":true`) {
						shared.Add(1)
					}
				}()
				time.Sleep(50 * time.Millisecond)
			}
			wg.Wait()
			require.Equal(t, [2]int{0, 0}, codes, "%v", errs)
			assert.Equal(t, 1, srv.count(path)-before, "one download for two stagers")
			assert.Equal(t, int32(1), shared.Load(), "one stager waited and used the other's download")
		})
	})
}
