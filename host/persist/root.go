package persist

import (
	"os"
	"path/filepath"
	"strconv"
)

// DefaultRoot is where kept sandboxes live when --keep-root is not
// given: /var/lib/oac for root; for other users $XDG_STATE_HOME/oac, else
// ~/.local/state/oac. Not the runtime state root (/run/oac or
// $XDG_RUNTIME_DIR/oac): that one is a tmpfs emptied at boot, and its
// sandboxes directory is swept of every directory no shim holds.
func DefaultRoot() string {
	if os.Geteuid() == 0 {
		return "/var/lib/oac"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "oac")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return filepath.Join(h, ".local", "state", "oac")
	}
	return filepath.Join(os.TempDir(), "oac-state-"+strconv.Itoa(os.Geteuid()))
}
