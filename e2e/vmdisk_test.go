//go:build linux

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// VM guests booted from the image's root disk, the way every provider
// runs the same image. Each row is one way to boot it; each promise is a
// function of a row, so the rows can join a table of providers and
// promises.

// vmRow is one way of booting a VM guest from an image built by the real
// oac-image: the architecture, the disk's filesystem and the binaries
// (built for the guest's architecture) the contract installs.
type vmRow struct {
	name string
	arch string
	fs   string // imagebuild.Ext4Name or imagebuild.ErofsName
	// bootTimeout is generous: a loaded CI machine emulates every
	// instruction (arm64 more slowly than amd64).
	bootTimeout time.Duration
	// set by setup
	image             string // the oac-image build output directory
	sandboxIO, daemon string
}

var vmRows = []vmRow{
	{name: "qemu-amd64-erofs", arch: "amd64", fs: imagebuild.ErofsName, bootTimeout: vmBootTimeout},
	{name: "qemu-arm64-ext4", arch: "arm64", fs: imagebuild.Ext4Name, bootTimeout: 2 * vmBootTimeout},
}

// guestBins are the binaries of one guest architecture.
type guestBins struct {
	guest, vmdaemon, sandboxIO, daemon string
}

var vmImages struct {
	mu   sync.Mutex
	done map[string]*vmImageResult
}

type vmImageResult struct {
	bins guestBins
	out  string
	err  error
	log  string
}

// kernelCacheFor is where make kernels put Debian's cloud kernel of arch.
func kernelCacheFor(arch string) string {
	if arch == "amd64" {
		return kernelCache()
	}
	if v := os.Getenv("OAC_KERNEL_CACHE_ARM64"); v != "" {
		return v
	}
	abs, _ := filepath.Abs("../.cache/kernel-" + arch)
	return abs
}

// needVMArch checks what booting an arch guest needs.
func needVMArch(t *testing.T, arch string) {
	t.Helper()
	bin, pkg := "qemu-system-x86_64", "qemu-system-x86"
	if arch == "arm64" {
		bin, pkg = "qemu-system-aarch64", "qemu-system-arm"
		_, err := os.Stat("/usr/share/qemu-efi-aarch64/QEMU_EFI.fd")
		need(t, err == nil, "no UEFI firmware for arm64 guests: apt-get install qemu-efi-aarch64 (or run make deps)")
	}
	_, err := exec.LookPath(bin)
	need(t, err == nil, bin+" is not installed: apt-get install "+pkg+" (or run make deps)")
	cache := kernelCacheFor(arch)
	_, err = os.Stat(filepath.Join(cache, "modules", "modules.dep"))
	need(t, err == nil, "no "+arch+" kernel cache at "+cache+": run make kernels")
	_, err = os.Stat("/usr/lib/qemu/virtiofsd")
	need(t, err == nil, "virtiofsd is missing: apt-get install qemu-system-common (or run make deps)")
	need(t, os.Geteuid() == 0, "VM images are written with owners 0 and 1000 and the qemu provider keeps state under /run/oac: run the e2e tests as root (sudo make test)")
}

// setupRow builds (once per architecture) the guest binaries and an image
// with every VM output, and holds one of the two VM slots until the test
// ends. Call it after t.Parallel.
func setupRow(t *testing.T, row vmRow) vmRow {
	t.Helper()
	needVMArch(t, row.arch)
	needImageTools(t)
	vmImages.mu.Lock()
	if vmImages.done == nil {
		vmImages.done = map[string]*vmImageResult{}
	}
	r, ok := vmImages.done[row.arch]
	if !ok {
		r = buildVMImage(row.arch)
		vmImages.done[row.arch] = r
	}
	vmImages.mu.Unlock()
	require.NoError(t, r.err, "%s", r.log)
	row.image, row.sandboxIO, row.daemon = r.out, r.bins.sandboxIO, r.bins.daemon
	vmSlots <- struct{}{}
	t.Cleanup(func() { <-vmSlots })
	return row
}

// buildVMImage cross-builds the guest's binaries for arch (the host's are
// bins') and runs oac-image build with a tiny base holding vmdaemon.
func buildVMImage(arch string) *vmImageResult {
	r := &vmImageResult{}
	dir, err := os.MkdirTemp(bins.dir, "vm-"+arch+"-") // removed with bins.dir when the run ends
	if err != nil {
		r.err = err
		return r
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		r.err = err
		return r
	}
	r.bins = guestBins{guest: bins.guest, vmdaemon: bins.vmdaemon, sandboxIO: bins.sandboxIO, daemon: bins.daemon}
	if arch != "amd64" {
		for _, b := range []struct {
			out *string
			pkg string
		}{{&r.bins.guest, "../cmd/oac-guest"}, {&r.bins.vmdaemon, "./internal/vmdaemon"},
			{&r.bins.sandboxIO, "./internal/standin/sandboxio"}, {&r.bins.daemon, "./internal/standin/daemon"}} {
			*b.out = filepath.Join(dir, arch+"-"+filepath.Base(b.pkg))
			cmd := exec.Command("go", "build", "-trimpath", "-o", *b.out, b.pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
			if out, err := cmd.CombinedOutput(); err != nil {
				r.err, r.log = fmt.Errorf("cross-build %s for %s: %w", b.pkg, arch, err), string(out)
				return r
			}
		}
	}
	base := filepath.Join(dir, "base")
	for _, d := range []string{"usr/bin", "usr/sbin", "etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			r.err = err
			return r
		}
	}
	b, err := os.ReadFile(r.bins.vmdaemon)
	if err == nil {
		err = os.WriteFile(filepath.Join(base, "usr/bin/vmdaemon"), b, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(base, "etc/os-release"), []byte("ID=oac-e2e\n"), 0o644)
	}
	for _, l := range [][2]string{{"usr/bin", "bin"}, {"usr/sbin", "sbin"}} {
		if err == nil {
			err = os.Symlink(l[0], filepath.Join(base, l[1]))
		}
	}
	if err != nil {
		r.err = err
		return r
	}
	r.out = filepath.Join(dir, "out")
	cache := kernelCacheFor(arch)
	cmd := exec.Command(bins.image, "build", "--arch", arch, "--base", base, "--agent", r.bins.guest, "--sandbox-io", r.bins.sandboxIO,
		"--output", "ext4,erofs,vm", "--kernel", filepath.Join(cache, "vmlinuz"), "--kernel-modules", filepath.Join(cache, "modules"), "-o", r.out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		r.err = fmt.Errorf("oac-image build --arch %s: %w", arch, err)
	}
	r.log = stderr.String()
	return r
}

// args are the provider flags that boot the row's image from its disk.
func (r vmRow) args(extra ...string) []string {
	return append([]string{
		"--kernel", filepath.Join(r.image, imagebuild.KernelName), "--initramfs", filepath.Join(r.image, imagebuild.InitramfsName),
		"--disk", filepath.Join(r.image, r.fs), "--boot-timeout", r.bootTimeout.String(), "--host-grace", vmHostGrace.String(),
	}, extra...)
}

func (r vmRow) fstype() string { return strings.TrimPrefix(r.fs, "disk.") }

func vmDaemonBootstrap(hostname string, args ...string) string {
	argv := `"` + vmDaemon + `"`
	for _, a := range args {
		argv += `,"` + a + `"`
	}
	return `{"version":1,"hostname":"` + hostname + `","stop_grace":"3s","daemon":{"argv":[` + argv + `]}}`
}

// stopPowersOff stops the sandbox with SIGTERM and checks that the guest
// powered the VM off and nothing stayed behind.
func stopPowersOff(t *testing.T, s *shim, name string) {
	t.Helper()
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(20*time.Second))
	assert.Contains(t, s.stderr.String(), "reboot: Power down", "the guest powered the VM off")
	assert.Empty(t, hostProcs("oac-"+name), "qemu exited")
	_, err := os.Stat(filepath.Join("/run/oac/sandboxes", name))
	assert.True(t, os.IsNotExist(err), "the state directory is removed")
}

// promiseBootsTheImagesRoot: the guest runs from the image's disk,
// mounted read-only, with writable layers where the contract needs them;
// the daemon runs as 1000:1000 in the workspace; a stop powers off.
func promiseBootsTheImagesRoot(t *testing.T, row vmRow) {
	name := uniqueName("vmroot")
	s := startShim(t, sandboxSpec{provider: "qemu", name: name,
		bootstrap: vmDaemonBootstrap(name, "--write", "/tmp", "--write", "/home/runtime", "--write", "/environment/workspace"),
		args:      row.args()})
	ready := s.waitState(api.StateReady, row.bootTimeout)
	t.Logf("%s: boot from %s to ready: %s", row.name, row.fs, bootTime(t, ready))
	assert.Equal(t, row.fstype()+" ro", s.waitLog("root=", 10*time.Second), "/ is the image's disk, read-only")
	assert.Equal(t, "uid=1000 gid=1000 groups=", s.waitLog("ids=", 5*time.Second))
	assert.Equal(t, "init", s.waitLog("pid1=", 5*time.Second), "oac-guest stayed PID 1 across the switch")
	assert.Equal(t, "/environment/workspace", s.waitLog("cwd=", 5*time.Second))
	assert.Equal(t, "true", s.waitLog("cgroup2=", 5*time.Second))
	for _, d := range []string{"/tmp", "/home/runtime", "/environment/workspace"} {
		assert.Equal(t, "ok", s.waitLog("wrote "+d+"=", 5*time.Second), "%s is writable by uid 1000", d)
	}
	assert.Contains(t, s.stderr.String(), `msg="switched into the image's root"`)
	stopPowersOff(t, s, name)
}

// promiseHostedBootstrapReady: a hosted sandbox (identity, oac-sandbox-io
// with its private file, a daemon with credentials and a health check)
// reaches ready, with oac-sandbox-io and the daemon installed by the host
// (--sandbox-io, --install) over the image's.
func promiseHostedBootstrapReady(t *testing.T, row vmRow) {
	name := uniqueName("vmhosted")
	b := contract("link.example.com")
	s := startShim(t, sandboxSpec{provider: "qemu", name: name, bootstrap: encode(t, b), args: row.args(
		"--tenant", tenantID, "--environment", environmentID, "--allocation", allocationID,
		"--sandbox-io", row.sandboxIO, "--install", "oac-daemon-standin="+row.daemon)})
	ready := s.waitState(api.StateReady, row.bootTimeout)
	t.Logf("%s: hosted bootstrap from %s to ready: %s", row.name, row.fs, bootTime(t, ready))
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	want, err := b.SandboxIO.Bootstrap.Encode()
	require.NoError(t, err)
	assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", s.waitLog("sandbox-io: file=", 10*time.Second))
	assert.Equal(t, sha(string(want)), s.waitLog("sandbox-io: file-sha256=", 10*time.Second))
	assert.Equal(t, bootstrap.CredentialDigest(linkCredential), s.waitLog("sandbox-io: credential-sha256=", 10*time.Second))
	assert.Equal(t, "0", s.waitLog("sandbox-io: env=", 10*time.Second), "an empty environment")
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("sandbox-io: ids=", 10*time.Second))
	assert.Equal(t, "/environment/workspace", s.waitLog("sandbox-io: cwd=", 10*time.Second))
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", 10*time.Second))
	assert.Contains(t, s.stderr.String(), `installed=2`, "both installed binaries were carried into the root")
	_, raw := s.allEvents()
	for _, line := range append(raw, s.stderr.String()) {
		assert.NotContains(t, line, linkCredential)
	}
	stopPowersOff(t, s, name)
}

// shareDir makes a host directory for a share whose parents others can
// search (virtiofsd reaches it as an unprivileged id), owned by uid:gid.
func shareDir(t *testing.T, uid, gid int, mode os.FileMode) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "oac-e2e-share-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(parent) })
	require.NoError(t, os.Chmod(parent, 0o755))
	d := filepath.Join(parent, "dir")
	require.NoError(t, os.Mkdir(d, mode))
	require.NoError(t, os.Chmod(d, mode))
	require.NoError(t, os.Chown(d, uid, gid))
	return d
}

// promiseSharesAndVolumes: the workspace share and a /home volume reach
// the guest over virtio-fs where the contract says; uid 1000 writes both;
// what it writes in the workspace belongs to the workspace's owner on the
// host, and the host's files are there to read.
func promiseSharesAndVolumes(t *testing.T, row vmRow) {
	const owner = 4242
	work := shareDir(t, owner, owner, 0o755)
	require.NoError(t, os.WriteFile(filepath.Join(work, "from-host"), []byte("written on the host"), 0o644))
	home := shareDir(t, 0, 0, 0o777)
	name := uniqueName("vmshare")
	s := startShim(t, sandboxSpec{provider: "qemu", name: name,
		bootstrap: vmDaemonBootstrap(name, "--write", "/environment/workspace", "--write", "/home/runtime", "--read", "/environment/workspace/from-host"),
		args:      row.args("--share", work, "--volume", "/home="+home)})
	s.waitState(api.StateReady, row.bootTimeout)
	assert.Equal(t, "written on the host", s.waitLog("read /environment/workspace/from-host=", 10*time.Second))
	assert.Equal(t, "ok", s.waitLog("wrote /environment/workspace=", 5*time.Second))
	assert.Equal(t, "ok", s.waitLog("wrote /home/runtime=", 5*time.Second))

	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(filepath.Join(work, "written-by-vmdaemon"), &st))
	assert.Equal(t, [2]uint32{owner, owner}, [2]uint32{st.Uid, st.Gid}, "uid 1000 writes the workspace as its owner")
	require.NoError(t, syscall.Stat(filepath.Join(home, "runtime"), &st))
	assert.Equal(t, uint32(0o700), st.Mode&0o7777, "the agent made /home/runtime on the volume")
	assert.GreaterOrEqual(t, st.Uid, uint32(1_000_000_000), "owned by the sandbox's host id range, never a host user")
	_, err := os.Stat(filepath.Join(home, "runtime", "written-by-vmdaemon"))
	assert.NoError(t, err, "the volume holds what the guest wrote")
	stopPowersOff(t, s, name)
}

func TestVMFromDisk(t *testing.T) {
	promises := []struct {
		name string
		run  func(*testing.T, vmRow)
	}{
		{"boots the image's root", promiseBootsTheImagesRoot},
		{"hosted bootstrap ready", promiseHostedBootstrapReady},
		{"shares and volumes", promiseSharesAndVolumes},
	}
	for _, row := range vmRows {
		for _, p := range promises {
			if row.arch == "arm64" && p.name != "hosted bootstrap ready" {
				continue // emulated arm64 is slow: the row a Mac boots proves the contract
			}
			t.Run(row.name+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				p.run(t, setupRow(t, row))
			})
		}
	}
}
