//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/docker"
	"github.com/oac/sandbox-agent/host/provider/qemu"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Kept sandboxes (provider.Spec.Keep): a run in this process through the
// Go API (host/sandbox with Config.Keep), stopped, and run again with the
// same directory finds what the first run wrote; Discard leaves nothing.

// keptRun is one run of a kept sandbox in this process.
type keptRun struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
	diag   lockedBuffer
	mu     sync.Mutex
	events []api.Event
	change chan struct{}
	start  time.Time
}

// runKept runs the sandbox until stop; bootstrapJSON is its bootstrap.
func runKept(t *testing.T, cfg sandbox.Config, bootstrapJSON string) *keptRun {
	t.Helper()
	b, err := bootstrap.Decode(strings.NewReader(bootstrapJSON))
	require.NoError(t, err)
	r := &keptRun{t: t, done: make(chan error, 1), change: make(chan struct{}, 1), start: time.Now()}
	cfg.Bootstrap = b
	// No fd channel in this process: its pair maker ends its locked OS
	// thread when it stops, and a child started from that thread with a
	// parent-death signal (the tests' private dockerd) would die with it.
	cfg.DataPlane = sandbox.DataPlaneOff
	cfg.Diag = &r.diag
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(&r.diag, nil)) // the shim's warnings
	}
	cfg.AgentPath = bins.guest
	cfg.Events = api.Func(func(e api.Event) {
		r.mu.Lock()
		r.events = append(r.events, e)
		r.mu.Unlock()
		select {
		case r.change <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- sandbox.Run(ctx, cfg) }()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("diagnostics:\n%s", r.diag.String())
		}
	})
	return r
}

func (r *keptRun) waitFor(pred func(api.Event) bool, timeout time.Duration, what string) api.Event {
	r.t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		for _, e := range r.events {
			if pred(e) {
				r.mu.Unlock()
				return e
			}
		}
		r.mu.Unlock()
		select {
		case <-r.change:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			r.mu.Lock()
			var states []string
			for _, e := range r.events {
				if e.Event == api.KindState {
					states = append(states, string(e.State)+": "+e.Message)
				}
			}
			r.mu.Unlock()
			r.t.Fatalf("no %s within %s; states: %s; diagnostics:\n%s", what, timeout, strings.Join(states, " | "), r.diag.String())
		}
	}
}

// ready waits for the ready state and returns the time since the run began.
func (r *keptRun) ready(timeout time.Duration) time.Duration {
	r.t.Helper()
	r.waitFor(func(e api.Event) bool { return e.Event == api.KindState && e.State == api.StateReady }, timeout, "ready")
	return time.Since(r.start)
}

func (r *keptRun) log(prefix string, timeout time.Duration) string {
	r.t.Helper()
	e := r.waitFor(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, prefix) }, timeout, "log line "+prefix)
	return strings.TrimPrefix(e.Line, prefix)
}

// stop stops the run (idempotent) and returns sandbox.Run's result.
func (r *keptRun) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(60 * time.Second):
		r.t.Errorf("the kept sandbox did not stop within 60s")
		return nil
	}
}

// keepDir is a kept sandbox's directory, 0700 as the shim makes it.
func keepDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "kept")
	require.NoError(t, os.Mkdir(d, 0o700))
	return d
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// debugfs runs e2fsprogs' debugfs on an ext4 image with commands.
func debugfs(t *testing.T, image string, write bool, cmds ...string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cmds")
	require.NoError(t, os.WriteFile(f, []byte(strings.Join(cmds, "\n")+"\n"), 0o644))
	args := []string{"-f", f, image}
	if write {
		args = append([]string{"-w"}, args...)
	}
	out, err := exec.Command("debugfs", args...).CombinedOutput()
	require.NoError(t, err, "debugfs: %s", out)
	return string(out)
}

// TestQemuKeepsASandboxAcrossRuns: the workload's writes to /home,
// /environment and /usr/local land on the kept disk and are there at the
// next start, as is a file put in the kept root layer from the host;
// Discard leaves nothing.
func TestQemuKeepsASandboxAcrossRuns(t *testing.T) {
	t.Parallel()
	row := setupRow(t, vmRows[0])
	for _, tool := range []string{"debugfs", "e2fsck"} {
		_, err := exec.LookPath(tool)
		need(t, err == nil, tool+" is missing: apt-get install e2fsprogs (or run make deps)")
	}
	p := &qemu.Provider{Kernel: filepath.Join(row.image, imagebuild.KernelName), Initramfs: filepath.Join(row.image, imagebuild.InitramfsName),
		Disk: filepath.Join(row.image, row.fs), HostGrace: vmHostGrace}
	dir := keepDir(t)
	name := uniqueName("vmkeep")
	cfg := sandbox.Config{Name: name, Provider: p, BootTimeout: row.bootTimeout, Keep: &provider.Keep{Dir: dir}}

	r := runKept(t, cfg, vmDaemonBootstrap(name, "--write", "/home/runtime", "--write", "/environment/workspace", "--write", "/usr/local"))
	first := r.ready(row.bootTimeout)
	assert.Equal(t, "ok", r.log("wrote /home/runtime=", 10*time.Second))
	assert.Equal(t, "ok", r.log("wrote /environment/workspace=", 5*time.Second))
	assert.Equal(t, "ok", r.log("wrote /usr/local=", 5*time.Second), "uid 1000 owns a kept sandbox's /usr/local")
	assert.Equal(t, "overlay rw", r.log("root=", 5*time.Second), "the kept root is an overlay, writable")
	require.NoError(t, r.stop())
	assert.Empty(t, hostProcs("oac-"+name), "qemu exited")
	assert.Equal(t, []string{"image.disk", "image.json", "kept.ext4"}, dirEntries(t, dir))
	kept := filepath.Join(dir, "kept.ext4")
	// The guest syncs but does not unmount before it powers off: the
	// journal is replayed first (0: clean, 1: replayed or fixed).
	out, err := exec.Command("e2fsck", "-fy", kept).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		err = nil
	}
	require.NoError(t, err, "the kept disk is a sound ext4 filesystem after a run: %s", out)
	assert.Contains(t, debugfs(t, kept, false, "ls root/upper/home/runtime"), "written-by-vmdaemon", "the guest's write is on the kept disk")
	// A package-like file under /usr/local, put in the kept root layer.
	src := filepath.Join(t.TempDir(), "keep-test")
	require.NoError(t, os.WriteFile(src, []byte("kept on the disk\n"), 0o644))
	debugfs(t, kept, true, "mkdir root/upper/usr", "mkdir root/upper/usr/local", "cd root/upper/usr/local", "write "+src+" keep-test")

	r = runKept(t, cfg, vmDaemonBootstrap(name, "--read", "/home/runtime/written-by-vmdaemon",
		"--read", "/environment/workspace/written-by-vmdaemon", "--read", "/usr/local/written-by-vmdaemon", "--read", "/usr/local/keep-test"))
	second := r.ready(row.bootTimeout)
	assert.Equal(t, "written in the guest", r.log("read /usr/local/written-by-vmdaemon=", 10*time.Second))
	assert.Equal(t, "written in the guest", r.log("read /home/runtime/written-by-vmdaemon=", 10*time.Second))
	assert.Equal(t, "written in the guest", r.log("read /environment/workspace/written-by-vmdaemon=", 5*time.Second))
	assert.Equal(t, "kept on the disk", r.log("read /usr/local/keep-test=", 5*time.Second))
	require.NoError(t, r.stop())
	t.Logf("qemu %s: first create to ready %s, second start to ready %s", row.name, first.Round(time.Millisecond), second.Round(time.Millisecond))

	require.NoError(t, p.Discard(context.Background(), name, dir))
	assert.Empty(t, dirEntries(t, dir), "Discard leaves nothing in the directory")
	_, err = os.Stat(filepath.Join("/run/oac/sandboxes", name))
	assert.True(t, os.IsNotExist(err), "nor a state directory")
}

// TestQemuKeepsAnInitramfsGuestAcrossRuns: without a root disk the kept
// disk holds /home, /environment and /usr/local.
func TestQemuKeepsAnInitramfsGuestAcrossRuns(t *testing.T) {
	t.Parallel()
	kernel, initramfs := needVM(t)
	for _, tool := range []string{"debugfs", "e2fsck"} {
		_, err := exec.LookPath(tool)
		need(t, err == nil, tool+" is missing: apt-get install e2fsprogs (or run make deps)")
	}
	p := &qemu.Provider{Kernel: kernel, Initramfs: initramfs, HostGrace: vmHostGrace}
	dir := keepDir(t)
	name := uniqueName("vmkeepi")
	cfg := sandbox.Config{Name: name, Provider: p, BootTimeout: vmBootTimeout, Keep: &provider.Keep{Dir: dir}}

	r := runKept(t, cfg, vmDaemonBootstrap(name, "--write", "/home/runtime", "--write", "/environment/workspace", "--write", "/usr/local"))
	r.ready(vmBootTimeout)
	assert.Equal(t, "ok", r.log("wrote /home/runtime=", 10*time.Second))
	assert.Equal(t, "ok", r.log("wrote /environment/workspace=", 5*time.Second))
	assert.Equal(t, "ok", r.log("wrote /usr/local=", 5*time.Second))
	require.NoError(t, r.stop())
	assert.Equal(t, []string{"kept.ext4"}, dirEntries(t, dir), "no image to copy")
	kept := filepath.Join(dir, "kept.ext4")
	out, err := exec.Command("e2fsck", "-fy", kept).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		err = nil
	}
	require.NoError(t, err, "e2fsck: %s", out)
	src := filepath.Join(t.TempDir(), "keep-test")
	require.NoError(t, os.WriteFile(src, []byte("kept on the disk\n"), 0o644))
	debugfs(t, kept, true, "cd dirs/usr-local/upper", "write "+src+" keep-test")

	r = runKept(t, cfg, vmDaemonBootstrap(name, "--read", "/home/runtime/written-by-vmdaemon",
		"--read", "/environment/workspace/written-by-vmdaemon", "--read", "/usr/local/written-by-vmdaemon", "--read", "/usr/local/keep-test"))
	r.ready(vmBootTimeout)
	assert.Equal(t, "written in the guest", r.log("read /usr/local/written-by-vmdaemon=", 10*time.Second))
	assert.Equal(t, "written in the guest", r.log("read /home/runtime/written-by-vmdaemon=", 10*time.Second))
	assert.Equal(t, "written in the guest", r.log("read /environment/workspace/written-by-vmdaemon=", 5*time.Second))
	assert.Equal(t, "kept on the disk", r.log("read /usr/local/keep-test=", 5*time.Second))
	require.NoError(t, r.stop())

	require.NoError(t, p.Discard(context.Background(), name, dir))
	assert.Empty(t, dirEntries(t, dir))
}

// TestDockerKeepsASandboxAcrossRuns: a kept sandbox's container outlives
// its run: what the workload wrote in /home, /environment and /usr/local
// is there at the next start, which says that the image moved; Discard
// removes the container.
func TestDockerKeepsASandboxAcrossRuns(t *testing.T) {
	e := needDocker(t)
	image := dockerImage(t)
	t.Setenv("DOCKER_HOST", e.Host) // the provider's client, in this process
	dir := keepDir(t)
	name := uniqueName("dockkeep")
	ctx := context.Background()
	// A reference of this test's own, moved to another image between runs.
	own := "oac-e2e/keep-" + name + ":1"
	_, err := e.Docker(ctx, "tag", image, own)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.Docker(ctx, "rmi", "--force", own) })
	p := &docker.Provider{Docker: e.Client, Image: own}
	cfg := sandbox.Config{Name: name, Provider: p, BootTimeout: bootTimeout, Keep: &provider.Keep{Dir: dir},
		Install: map[string]string{"oac-daemon-standin": bins.daemon}}
	// The workload (uid 1000) writes in /home, /environment and
	// /usr/local, as a package manager run by the agent would.
	persisted := []string{"/home/runtime/keep-test", "/environment/workspace/keep-test", "/usr/local/lib/oac-keep/package-file"}
	argv := []string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", "4096", "--marker", name}
	for _, f := range persisted {
		argv = append(argv, "--persist", f)
	}
	argvJSON, _ := json.Marshal(argv)
	boot := `{"version":1,"hostname":"dock","stop_grace":"2s","daemon":{"argv":` + string(argvJSON) + `},` +
		`"credentials":{"username_env":"OAC_SERVER_USERNAME","password_env":"OAC_SERVER_PASSWORD"},"health":{"port":4096}}`
	t.Cleanup(func() { _ = p.Discard(ctx, name, dir) })

	r := runKept(t, cfg, boot)
	first := r.ready(bootTimeout)
	for _, f := range persisted {
		assert.Equal(t, "absent", r.log("daemon: persist "+f+"=", 10*time.Second))
		assert.Equal(t, "ok", r.log("daemon: persisted "+f+"=", 5*time.Second), "uid 1000 writes %s", f)
	}
	require.NoError(t, r.stop())
	require.Len(t, dockerContainers(t, name), 1, "the kept container outlives the run")
	diff, err := e.Docker(ctx, "diff", docker.ContainerName(name))
	require.NoError(t, err)
	assert.Contains(t, diff, "A /usr/local/lib/oac-keep/package-file", "the container's writable layer holds what was written")
	_, err = e.Import(ctx, guestImage(t), own) // the reference now names a new image
	require.NoError(t, err)

	r = runKept(t, cfg, boot)
	second := r.ready(bootTimeout)
	assert.Contains(t, r.diag.String(), "keeps running the old one until reset", "the moved image is said")
	for _, f := range persisted {
		assert.Equal(t, "kept", r.log("daemon: persist "+f+"=", 10*time.Second), "the second start finds %s", f)
	}
	require.NoError(t, r.stop())
	t.Logf("docker: first create to ready %s, second start to ready %s", first.Round(time.Millisecond), second.Round(time.Millisecond))

	require.NoError(t, p.Discard(ctx, name, dir))
	assert.Empty(t, dockerContainers(t, name), "Discard removes the container")
	vols, err := e.Docker(ctx, "volume", "ls", "--quiet", "--filter", "label=oac.sandbox="+name)
	require.NoError(t, err)
	assert.Empty(t, vols, "and leaves no volume")
	assert.Empty(t, dirEntries(t, dir), "nor anything in the directory")
	_, err = os.Stat(filepath.Join("/run/oac/sandboxes", name))
	assert.True(t, os.IsNotExist(err), "nor a state directory")
	require.NoError(t, p.Discard(ctx, name, dir), "twice is fine")
}
