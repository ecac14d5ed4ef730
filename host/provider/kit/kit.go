package kit

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// DefaultStateRoot holds per-sandbox state (every provider's, so that
// sandbox names, id ranges and vsock slots are unique across them).
const DefaultStateRoot = "/run/oac"

// Paths inside the guest that the bwrap, OCI and docker providers share.
const (
	GuestRunDir     = "/run/oac"
	GuestAgentPath  = "/run/oac/oac-guest"
	GuestSocketPath = "/run/oac/agent.sock"
)

// StateRoot returns root, or DefaultStateRoot when root is "".
func StateRoot(root string) string {
	if root != "" {
		return root
	}
	return DefaultStateRoot
}

// UserStateRoot is StateRoot for providers that also run without root:
// DefaultStateRoot for root, else $XDG_RUNTIME_DIR/oac, else a directory
// of the user's in the temporary directory.
func UserStateRoot(root string) string {
	if root != "" {
		return root
	}
	if os.Geteuid() == 0 {
		return DefaultStateRoot
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "oac")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("oac-%d", os.Geteuid()))
}

// BesideShim returns the path of name in oac-shim's directory ("" when the
// executable cannot be found): where make build and make initramfs put
// the images a provider boots by default.
func BesideShim(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), name)
}

// Binary returns given, or the binary called name found in PATH. When
// there is none the error wraps provider.ErrUnavailable and says, for
// the provider called prov, what is missing.
func Binary(prov, given, name, missing string) (string, error) {
	if given != "" {
		return given, nil
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %s", provider.ErrUnavailable, prov, missing)
	}
	return path, nil
}

// ListenUnix listens on the transport socket at path, mode 0600.
func ListenUnix(path string) (*net.UnixListener, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// RunDir makes dir/run, the host directory container providers bind at
// GuestRunDir: the agent binary's mount point and the transport socket,
// on which it listens.
func RunDir(dir string) (run string, ln *net.UnixListener, err error) {
	run = filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		return "", nil, fmt.Errorf("create %s: %w", run, err)
	}
	if err := os.WriteFile(filepath.Join(run, "oac-guest"), nil, 0o644); err != nil {
		return "", nil, fmt.Errorf("create agent mount point: %w", err)
	}
	ln, err = ListenUnix(filepath.Join(run, "agent.sock"))
	return run, ln, err
}

// Limits every container sandbox gets (docker and OCI): those hosted
// containers already run with (docs/contract.md, "Hardening of hosted
// containers").
const (
	PidsLimit  = bootstrap.WorkloadPids
	TmpSizeMiB = 128
	RunSizeMiB = 16
)

// BootImages returns kernel and initramfs, each defaulting to the image
// make initramfs puts beside oac-shim (vmlinuz, initramfs.img).
func BootImages(kernel, initramfs string) (string, string) {
	if kernel == "" {
		kernel = BesideShim("vmlinuz")
	}
	if initramfs == "" {
		initramfs = BesideShim("initramfs.img")
	}
	return kernel, initramfs
}
