//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// Hosted containers: what the oci and docker providers do with --volume,
// and what they refuse before anything runs.

// TestAVolumeCarriesTheHostedContractInContainers boots the hosted
// contract with /home on a host directory under runc and under a real
// Docker engine: the agent makes /home/runtime and the private file there,
// owned by the guest's uid 1000 (a host id of the sandbox's own range under
// runc, 1000 itself under docker without userns-remap).
func TestAVolumeCarriesTheHostedContractInContainers(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(t *testing.T) ([]string, []string)
	}{
		{"oci runc", func(t *testing.T) ([]string, []string) {
			needOCI(t, "runc")
			return []string{"--provider", "oci", "--runtime", "runc"}, nil
		}},
		{"docker", func(t *testing.T) ([]string, []string) {
			return []string{"--provider", "docker", "--docker-image", dockerImage(t)}, needDocker(t).Env()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, env := tc.args(t)
			home := volume(t)
			b := contract("link.example.com")
			s := startShim(t, sandboxSpec{provider: args[1], env: env, bootstrap: encode(t, b),
				args: append(append(args[2:], identityArgs()...), "--volume", "/home="+home)})
			s.waitState(api.StateReady, bootTimeout)
			assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", s.waitLog("sandbox-io: file=", bootTimeout))

			file := filepath.Join(home, "runtime", "sandbox-io-bootstrap.json")
			st, err := os.Stat(file)
			require.NoError(t, err, "the private file is on the volume")
			assert.Equal(t, os.FileMode(0o600), st.Mode())
			dir, err := os.Stat(filepath.Join(home, "runtime"))
			require.NoError(t, err)
			assert.Equal(t, os.ModeDir|0o700, dir.Mode())
			uid := st.Sys().(*syscall.Stat_t).Uid
			if tc.name == "docker" {
				assert.Equal(t, uint32(1000), uid, "docker without userns-remap: guest uid 1000 is host uid 1000")
			} else {
				assert.Greater(t, uid, uint32(1000), "runc: guest uid 1000 is a host id of the sandbox's own range")
			}
			want, err := b.SandboxIO.Bootstrap.Encode()
			require.NoError(t, err)
			assert.Equal(t, sha(string(want)), s.waitLog("sandbox-io: file-sha256=", bootTimeout))
			s.signal(syscall.SIGTERM)
			assert.Equal(t, 0, s.exit(30*time.Second))
			_, err = os.Stat(file)
			assert.NoError(t, err, "the volume keeps it after the sandbox is gone")
		})
	}
}

// TestARootfsThatLacksAMountPointIsRefusedBeforeAnythingRuns: an image
// gets no new mount point (the runtime must not write into it), so an
// install with nothing to bind over is refused with what to do.
func TestARootfsThatLacksAMountPointIsRefusedBeforeAnythingRuns(t *testing.T) {
	needOCI(t, "runc")
	rootfs := guestRootfs(t)
	name := uniqueName("oci")
	s := startShim(t, sandboxSpec{provider: "oci", name: name, bootstrap: encode(t, contract("link.example.com")),
		args: append(identityArgs(), "--runtime", "runc", "--rootfs", rootfs, "--install", "not-in-the-image="+bins.daemon)})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, "install not-in-the-image: the rootfs has no regular file /usr/local/bin/not-in-the-image to bind it over")
	s.exitFailed(api.CodeInvalidConfig, 10*time.Second)
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", name))
	assert.NoFileExists(t, filepath.Join(rootfs, "usr/local/bin/not-in-the-image"), "nothing was written into the image")
	assert.Empty(t, hostProcs("oac-"+name))
	assert.Equal(t, "", pidsMax(name))
}
