package shimcli

import (
	"io"

	"github.com/oac/sandbox-agent/internal/cli"
)

// parseRunFlags parses oac-shim run's (or start's) arguments as the
// command does, usage errors on stderr.
func parseRunFlags(cmd string, args []string, stderr io.Writer) (*runFlags, int) {
	return parseRun(cmd, args, cli.Env{Stdout: io.Discard, Stderr: stderr})
}
