package kit

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/oac/sandbox-agent/host/provider"
)

// HostPaths are a spec's host paths, absolute and checked once: what a
// runtime binds into the guest.
type HostPaths struct {
	// Agent is oac-guest.
	Agent string
	// Volumes maps a guest directory to its host directory.
	Volumes map[string]string
	// Installs are name and host file, in Spec.InstallNames order.
	Installs [][2]string
}

// CheckHostPaths resolves every host path of spec and checks it before
// anything is made: the agent and each install must be regular files
// readable and executable by others (the guest's ids are not the host's,
// and uid 1000 runs an install), each volume a directory. Errors wrap
// provider.ErrInvalidSpec and name the flag. Runtimes run in other
// working directories, so every path comes back absolute.
func CheckHostPaths(spec provider.Spec) (HostPaths, error) {
	hp := HostPaths{Volumes: map[string]string{}}
	var err error
	if hp.Agent, err = runnableByOthers(spec.AgentPath); err != nil {
		return hp, fmt.Errorf("%w: agent binary: %v (build it with make build)", provider.ErrInvalidSpec, err)
	}
	for dir, host := range spec.Volumes {
		abs, err := filepath.Abs(host)
		if err != nil {
			return hp, fmt.Errorf("%w: volume %s: %v", provider.ErrInvalidSpec, dir, err)
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return hp, fmt.Errorf("%w: volume %s: %s is not a directory", provider.ErrInvalidSpec, dir, abs)
		}
		hp.Volumes[dir] = abs
	}
	installs := spec.Installs()
	for _, n := range spec.InstallNames() {
		abs, err := runnableByOthers(installs[n])
		if err != nil {
			return hp, fmt.Errorf("%w: install %s: %v (uid 1000 runs it)", provider.ErrInvalidSpec, n, err)
		}
		hp.Installs = append(hp.Installs, [2]string{n, abs})
	}
	return hp, nil
}

func runnableByOthers(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(abs); err != nil || !st.Mode().IsRegular() || st.Mode()&0o005 != 0o005 {
		return "", fmt.Errorf("%s must be a regular file readable and executable by others", abs)
	}
	return abs, nil
}
