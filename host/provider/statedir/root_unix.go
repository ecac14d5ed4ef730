//go:build unix

package statedir

import (
	"fmt"
	"os"
	"path/filepath"
)

// SystemRoot is where sandbox state lives when the shim runs as root.
const SystemRoot = "/run/oac"

// DefaultRoot returns where a provider keeps sandbox state by default:
// SystemRoot as root, else $XDG_RUNTIME_DIR/oac, else a directory of the
// user's own in the temporary directory.
func DefaultRoot() string {
	if os.Geteuid() == 0 {
		return SystemRoot
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "oac")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("oac-%d", os.Geteuid()))
}
