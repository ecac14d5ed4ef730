//go:build linux

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/netns"
)

// The rows of TestConformance: one function per provider.

// runDir is where root's providers keep a sandbox's state.
func runDir(name string) string { return filepath.Join("/run/oac/sandboxes", name) }

func (f *confFixtures) args(extra ...string) []string {
	return append(append(append([]string(nil), f.identity...), f.upstream...), extra...)
}

// caFiles bind the run's CA bundle over the host's in oac-shim's mount
// namespace: the default root shows the host's /etc/ssl.
func (f *confFixtures) caFiles() map[string]string {
	return map[string]string{"/etc/ssl/certs/ca-certificates.crt": f.caBundle}
}

func rowBwrap(t *testing.T, f *confFixtures) confEnv {
	needBwrap(t)
	needUnshare(t)
	return confEnv{
		spec: sandboxSpec{provider: "bwrap", shim: f.private.shim, agent: f.private.guest,
			args: f.args(f.private.installs()...), files: f.caFiles()},
		stateDir:     runDir,
		carrier:      carrierFD,
		direct:       true,
		claimVolumes: true,
	}
}

func rowBwrapRootless(t *testing.T, f *confFixtures) confEnv {
	needRootless(t)
	needUnshare(t)
	u, err := user.Lookup(subIDUser)
	require.NoError(t, err)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// The user's own binaries, in a directory only they can traverse.
	dir, err := os.MkdirTemp("", "oac-e2e-user-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := installBins(t, dir, uid, gid)
	return confEnv{
		spec: sandboxSpec{provider: "bwrap", user: subIDUser, shim: p.shim, agent: p.guest,
			args: f.args(p.installs()...), files: f.caFiles()},
		stateDir: func(name string) string {
			return filepath.Join(os.TempDir(), fmt.Sprintf("oac-%d", uid), "sandboxes", name)
		},
		carrier: carrierHand,
	}
}

// rowOCI runs runc with the embedded default root (a read-only view of
// the host) and crun with the image oac-image built, as it is (--rootfs).
func rowOCI(runtime string) func(t *testing.T, f *confFixtures) confEnv {
	return func(t *testing.T, f *confFixtures) confEnv {
		needOCI(t, runtime)
		needUnshare(t)
		args := []string{"--runtime", runtime}
		var files map[string]string
		if runtime == "crun" {
			args = append(args, "--rootfs", guestRootfs(t))
		} else {
			files = f.caFiles()
		}
		return confEnv{
			spec: sandboxSpec{provider: "oci", shim: f.private.shim, agent: f.private.guest,
				args: f.args(append(args, f.private.installs()...)...), files: files},
			stateDir:     runDir,
			carrier:      carrierFD,
			direct:       true,
			claimVolumes: true,
			leftovers: func(name string) []string {
				var left []string
				if st := filepath.Join(runtimeRoot(runtime), "oac-"+name); dirExists(st) {
					left = append(left, runtime+" container state "+st)
				}
				if pidsMax(name) != "" {
					left = append(left, "cgroup of oac-"+name)
				}
				return left
			},
		}
	}
}

func rowDocker(t *testing.T, f *confFixtures) confEnv {
	e := needDocker(t)
	image := dockerImage(t)
	before, err := e.Layers()
	require.NoError(t, err)
	return confEnv{
		spec: sandboxSpec{provider: "docker", shim: f.private.shim, agent: f.private.guest, env: e.Env(),
			args: f.args(append([]string{"--docker-image", image}, f.private.installs()...)...)},
		stateDir: runDir,
		carrier:  carrierFD,
		leftovers: func(name string) []string {
			var left []string
			ctx := context.Background()
			if out, err := e.Docker(ctx, "ps", "--all", "--quiet", "--filter", "name=^oac-"+name+"$"); err != nil || out != "" {
				left = append(left, fmt.Sprintf("container oac-%s: %q %v", name, out, err))
			}
			// Every layer is the image's or a container's that exists.
			inUse := map[string]bool{}
			for _, l := range before {
				inUse[l] = true
			}
			used, _ := e.ContainerLayers()
			for _, l := range used {
				inUse[l] = true
			}
			now, _ := e.Layers()
			for _, l := range now {
				if !inUse[l] {
					left = append(left, "image layer "+l)
				}
			}
			for _, cg := range e.Cgroups() {
				left = append(left, "cgroup "+cg)
			}
			return left
		},
	}
}

// confVM is the initramfs the qemu row boots: the real oac-guest as
// /init, the stand-ins and the run's CA bundle.
var confVM struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

func rowQemu(t *testing.T, f *confFixtures) confEnv {
	kernel, _ := needVM(t)
	confVM.once.Do(func() {
		confVM.path = filepath.Join(bins.dir, "conformance-initramfs.img")
		confVM.out, confVM.err = exec.Command(bins.image, "initramfs", "--agent", bins.guest,
			"--kernel-modules", filepath.Join(kernelCache(), "modules"),
			"--file", bins.sandboxIO+":/usr/local/bin/oac-sandbox-io",
			"--file", bins.daemon+":"+daemonBin,
			"--file", runCA.bundle+":/etc/ssl/certs/ca-certificates.crt:0644",
			"-o", confVM.path).CombinedOutput()
	})
	require.NoError(t, confVM.err, "oac-image initramfs: %s", confVM.out)
	return confEnv{
		spec: sandboxSpec{provider: "qemu", shim: f.private.shim, agent: f.private.guest,
			args: f.args(append([]string{"--kernel", kernel, "--initramfs", confVM.path, "--boot-timeout", vmBootTimeout.String(),
				"--host-grace", vmHostGrace.String()}, f.private.installs()...)...)},
		bootTimeout: vmBootTimeout,
		stateDir:    runDir,
		carrier:     carrierSession,
	}
}

func rowWSL(t *testing.T, f *confFixtures) confEnv {
	needRootForState(t)
	w := newWSLDistro(t)
	nsPath, peer := wslNetwork(t)
	return confEnv{
		spec: sandboxSpec{provider: "wsl", shim: f.private.shim, agent: f.private.guest,
			env: append(w.env, "OAC_FAKE_WSL_NETNS="+nsPath), args: f.args(w.args()...)},
		stateDir: runDir,
		peer:     peer,
		carrier:  carrierSession,
		leftovers: func(name string) []string {
			for _, d := range w.distros() {
				if d == "oac-"+name {
					return []string{"WSL distribution " + d}
				}
			}
			return nil
		},
	}
}

// wslNetwork gives the fake distribution the network a WSL2 distribution
// has: a namespace with a real interface (one end of a veth pair) whose
// other end, in a second namespace, has an echo server. Both namespaces
// are the test's, so the host's own network is never touched.
func wslNetwork(t *testing.T) (string, *confPeer) {
	t.Helper()
	_, err := exec.LookPath("ip")
	need(t, err == nil, "ip is not installed: apt-get install iproute2 (or run make deps)")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	distro, outside := "oac-e2e-d-"+id, "oac-e2e-p-"+id
	x, _ := rand.Int(rand.Reader, big.NewInt(250))
	y, _ := rand.Int(rand.Reader, big.NewInt(60))
	prefix := fmt.Sprintf("10.%d.%d.", x.Int64()+1, y.Int64()*4)
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	ip("netns", "add", distro)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", distro).Run() })
	ip("netns", "add", outside)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", outside).Run() })
	ip("-n", distro, "link", "add", "oacd"+id, "type", "veth", "peer", "name", "oacp"+id, "netns", outside)
	ip("-n", distro, "addr", "add", prefix+"1/30", "dev", "oacd"+id)
	ip("-n", distro, "link", "set", "oacd"+id, "up")
	ip("-n", distro, "link", "set", "lo", "up")
	ip("-n", outside, "addr", "add", prefix+"2/30", "dev", "oacp"+id)
	ip("-n", outside, "link", "set", "oacp"+id, "up")
	ip("-n", outside, "link", "set", "lo", "up")

	nsOut, err := netns.Open("/run/netns/" + outside)
	require.NoError(t, err)
	t.Cleanup(func() { nsOut.Close() })
	addr := prefix + "2:7007"
	ln, err := nsOut.Listen("tcp", addr)
	require.NoError(t, err)
	serveEcho(t, ln)
	path := "/run/netns/" + distro
	nsDistro, err := netns.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { nsDistro.Close() })
	return path, &confPeer{addr: addr, reach: func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := nsDistro.DialContext(ctx, "tcp", addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("control\n")); err != nil {
			return "", err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line), err
	}}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
