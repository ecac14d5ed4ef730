package directguard

import "log/slog"

// Defaults of Config. The share directory is a directory of its own: a
// 0700 one made under the shim's state root (/run/oac) would make its
// parent too, and the guests' ids must traverse that.
const (
	DefaultShareDir  = "/run/oac-direct-ports"
	DefaultShareSize = 1024
)

// Config configures a Guard.
type Config struct {
	// ShareDir holds the port shares' lock files (default
	// DefaultShareDir, created 0700). Every Guard of a host must use the
	// same ShareDir and ShareSize, or their shares may overlap.
	ShareDir string
	// ShareSize is the number of ports in one share (default
	// DefaultShareSize). It is capped at half of
	// net.ipv4.ip_local_port_range, so at least one share fits in the
	// half that shares may use.
	ShareSize int
	// Log, when set, gets the guard's notable events.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.ShareDir == "" {
		c.ShareDir = DefaultShareDir
	}
	if c.ShareSize <= 0 {
		c.ShareSize = DefaultShareSize
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}
