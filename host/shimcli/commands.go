package shimcli

import (
	"fmt"
	"io"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
)

// commands is oac-shim's command table, one entry a command: help and
// the completion scripts are generated from it and from each command's
// own flags. A command declares its flags and calls cli.Parse before it
// does anything else.
func commands() []*cli.Command {
	return []*cli.Command{
		{Name: "run", Args: "NAME", Summary: "a throwaway sandbox: created, started and destroyed when the shim exits", Help: runHelp, Run: runCmd},
		{Name: "create", Args: "NAME", Summary: "a kept sandbox: its record and its provider's state, nothing booted", Help: createHelp, Run: createCmd},
		{Name: "start", Args: "NAME", Summary: "run a kept sandbox until it stops, as run does", Help: startHelp, Run: startCmd},
		{Name: "reset", Args: "NAME", Summary: "a kept sandbox back to its pristine image (name and record kept)", Run: resetCmd},
		{Name: "destroy", Args: "NAME", Summary: "every byte a kept sandbox kept", Run: destroyCmd},
		{Name: "list", Summary: "the kept sandboxes (--running: the sandboxes shims run now)", Run: listCmd},
		{Name: "stop", Args: "(NAME... | --all)", Summary: "stop running sandboxes in order, each within the grace", Help: stopHelp, Run: stopCmd},
		{Name: "claim", Args: "NAME", Summary: "a warm sandbox (run --warm) becomes a tenant's: bootstrap, egress policy, forwards", Help: claimHelp, Run: claimCmd},
		{Name: "attach", Args: "NAME", Summary: "a sandbox run with --outlive-parent: its events replayed and followed, commands on stdin", Help: attachHelp, Run: attachCmd},
		{Name: "warm-pool", Summary: "the SandboxTemplate and SandboxWarmPool a cluster keeps warm Pods of this provider with (kubernetes)", Help: warmPoolHelp, Run: warmPoolCmd},
		{Name: "check", Summary: "the OS policy, and which providers work here and why not", Run: checkCmd},
	}
}

const runHelp = `A throwaway sandbox NAME (a-z, 0-9, '-'): created, started and destroyed when
the shim exits. Events go to stdout as JSON lines (schema/event.schema.json).
oac-shim create and start keep one across runs (docs/kept.md).
`

const createHelp = `Records the kept sandbox NAME with its create flags (--provider, --rootfs,
--sandbox-io, --install and the provider's own) and makes its provider's kept
state without booting it; oac-shim start runs it (docs/kept.md).
`

const startHelp = `Runs the kept sandbox NAME (oac-shim create) until it stops, as run does: the
same events, control API and exit statuses. It takes run's flags but the create
flags, which the record holds; what it writes in /home, /environment and
/usr/local outlives the run.
`

const attachHelp = `The events of the sandbox NAME, started with --outlive-parent, from its journal
(--from SEQ, or now) and then live, on stdout; control commands on stdin (JSON
lines), their answers on stdout. Exits 0 after the final stopped state, the
failure's status after failed, 10 when nothing runs NAME (or it runs without
--outlive-parent), 11 when its shim died.
`

const stopHelp = `Asks each running sandbox's shim to stop in order (its control socket, else
SIGTERM to the process proven to be its shim), waits for each within --grace and
kills one that outlives it. Exit status 0 when every one stopped in order (a
name no shim runs counts as stopped), 1 otherwise, 2 on a usage error.
`

// program is oac-shim's table with the providers' flags in its help.
func program() *cli.Program {
	return &cli.Program{Name: "oac-shim", Help: providerHelp(), Commands: commands()}
}

// providerHelp lists each registered provider's flags, which run, create
// and check take.
func providerHelp() string {
	var b strings.Builder
	b.WriteString("provider flags (run, create and check; --provider " + strings.Join(provider.Names(), "|") + "):\n")
	flags := provider.Usage()
	for _, name := range provider.Names() {
		indent := fmt.Sprintf("  %-7s ", name+":")
		line := indent
		for _, part := range strings.SplitAfter(flags[name], "] ") {
			if len(line)+len(part) > 90 && line != indent {
				b.WriteString(strings.TrimRight(line, " ") + "\n")
				line = strings.Repeat(" ", len(indent))
			}
			line += part
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// Main runs oac-shim with args (without the program name) and returns the
// exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return program().Main(args, cli.Env{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
