//go:build crashpoints && unix

package crashpoint

import (
	"fmt"
	"os"
	"syscall"
)

// Enabled is whether this build can crash at a point.
const Enabled = true

// Hit kills the process with SIGKILL when $OAC_CRASH_AT names p.
func Hit(p Point) {
	if os.Getenv(EnvVar) != p.name {
		return
	}
	fmt.Fprintf(os.Stderr, "crash point %s\n", p.name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Armed reports whether Hit(p) kills: a step that must leave a write half
// done before the kill (a torn line) asks first.
func Armed(p Point) bool { return os.Getenv(EnvVar) == p.name }
