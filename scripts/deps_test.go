// Package scripts_test holds the repository's set-up to its promises: what
// make demo and make test install (a demo installs no container engine, VM
// or cluster), and the README's snippets being the programs the tests run.
package scripts_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// installs runs deps.sh the way make TARGET would on a machine where no
// package is installed yet, with apt-get replaced by a recorder, and
// returns the packages it asked apt-get for.
func installs(t *testing.T, target string) []string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed: apt-get install make")
	}
	dry, err := exec.Command("make", "-C", "..", "-n", target).CombinedOutput()
	require.NoError(t, err, "make -n %s: %s", target, dry)

	fake := t.TempDir()
	record := filepath.Join(fake, "apt-get.args")
	write := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(fake, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	}
	write("dpkg-query", "exit 1")            // nothing is installed
	write("apt-get", `echo "$@" >> `+record) // what would be installed
	write("sudo", `exec "$@"`)               // as a user with sudo
	var pkgs []string
	for _, line := range strings.Split(string(dry), "\n") {
		i := strings.Index(line, "scripts/deps.sh ")
		if i < 0 {
			continue
		}
		cmd := exec.Command("bash", "-c", line[i:])
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
	}
	got, err := os.ReadFile(record)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	for _, l := range bytes.Split(got, []byte("\n")) {
		f := strings.Fields(string(l))
		if len(f) > 0 && f[0] == "install" {
			for _, p := range f[1:] {
				if !strings.HasPrefix(p, "-") {
					pkgs = append(pkgs, p)
				}
			}
		}
	}
	return pkgs
}

// Container engines, VMs and cluster parts: what a desktop with Docker's
// own packages (containerd.io) would see fought over, or never asked for.
var notOnADesktop = []string{"docker.io", "containerd", "runc", "crun", "podman", "qemu-system-x86", "qemu-system-arm", "qemu-efi-aarch64", "etcd-server", "containernetworking-plugins", "apparmor", "iptables"}

func TestMakeDemoInstallsOnlyWhatTheDemoUses(t *testing.T) {
	pkgs := installs(t, "demo")
	assert.Contains(t, pkgs, "bubblewrap", "the demo boots bubblewrap guests")
	assert.Contains(t, pkgs, "curl", "the demo's parent curls the daemon")
	for _, p := range notOnADesktop {
		assert.NotContains(t, pkgs, p, "make demo must not install %s", p)
	}
}

func TestMakeTestInstallsWhatTheDemoDoesAndTheRows(t *testing.T) {
	pkgs := installs(t, "test-deps")
	demo := installs(t, "demo")
	for _, p := range demo {
		assert.Contains(t, pkgs, p)
	}
	for _, p := range notOnADesktop {
		if p == "podman" {
			continue // no row uses it
		}
		assert.Contains(t, pkgs, p, "make test's rows use %s", p)
	}
}
