package shimcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/internal/cli"
)

// listCmd is oac-shim list: the kept sandboxes, or with --running the
// running ones (throwaway and kept) with their control endpoints.
func listCmd(args []string, env cli.Env) int {
	stdout := env.Stdout
	c := &keptCmd{}
	fs := keptFlagSet("list", c, env)
	asJSON := fs.Bool("json", false, "print one JSON object (schema/list.schema.json; with --running schema/running.schema.json)")
	running := fs.Bool("running", false, "list the sandboxes a shim runs now (oac-shim run and start) under the keep root, with their control sockets")
	if code, ok := parseKept(fs, c, args, false); !ok {
		return code
	}
	if *running {
		return listRunning(c, *asJSON)
	}
	rep, err := c.service().List(context.Background())
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		printJSON(stdout, rep)
		return 0
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPROVIDER\tIMAGE\tSTATE\tSIZE")
	for _, e := range rep.Sandboxes {
		st := string(e.State)
		if e.InUse {
			st += " (in use)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.Name, orDash(e.Provider), orDash(e.Image), st, humanSize(e.SizeBytes))
	}
	_ = w.Flush()
	return 0
}

func printJSON(w io.Writer, v any) { cli.PrintJSON(w, v) }

// RunningReport lists the running sandboxes of the registry and removes
// what dead shims left there (reported as Cleaned).
func RunningReport(g *kept.Registry) (api.RunningReport, error) {
	rep := api.RunningReport{SchemaVersion: api.SchemaVersion, Sandboxes: []api.RunningEntry{}, Cleaned: []api.CleanedEntry{}}
	live, cleaned, err := g.List()
	if err != nil {
		return rep, err
	}
	for _, r := range live {
		rep.Sandboxes = append(rep.Sandboxes, r.Entry())
	}
	rep.Cleaned = append(rep.Cleaned, cleaned...)
	return rep, nil
}

func listRunning(c *keptCmd, asJSON bool) int {
	rep, err := RunningReport(kept.OpenRegistry(c.keepRoot))
	if err != nil {
		return c.fail(err)
	}
	for _, e := range rep.Cleaned {
		fmt.Fprintf(c.stderr, "oac-shim: %s: %s\n", e.Name, e.Message)
	}
	if asJSON {
		printJSON(c.stdout, rep)
		return 0
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tKIND\tPROVIDER\tPID\tSTARTED\tCONTROL")
	for _, e := range rep.Sandboxes {
		if e.Message != "" {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t%s\n", e.Name, e.Message)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", e.Name, e.Kind, e.Provider, e.PID, e.Started.Local().Format(time.DateTime), orDash(e.ControlSocket))
	}
	_ = w.Flush()
	return 0
}

// announce enters this shim in its keep root's running sandboxes, once it
// serves its control API and handles SIGTERM: from then on oac-shim stop
// (and list --running) finds it. The entry is the shim's until runShim
// returns. A keep root it cannot write leaves it unlisted, said on stderr.
func (s *shim) announce() {
	kind := api.RunThrowaway
	if s.kept != nil {
		kind = api.RunKept
	}
	rec := kept.ShimRecord{
		Name: s.name, Kind: kind, Provider: s.f.prov, PID: os.Getpid(), ProcStart: selfStart(),
		ControlSocket: provider.AbsPath(s.f.controlSocket), OutliveParent: s.f.outlive, Started: time.Now().UTC().Truncate(time.Millisecond),
		Version: buildinfo.Read().Version,
	}
	if s.f.announced != nil {
		// Claimed at the start (an outliving shim's journal is there).
		if err := s.f.announced.Publish(rec); err != nil {
			s.log.Warn("this sandbox is not among the running ones oac-shim list --running and stop find", "err", err)
		}
		return
	}
	a, err := kept.OpenRegistry(s.f.keepRoot).Announce(rec)
	if err != nil {
		s.log.Warn("this sandbox is not among the running ones oac-shim list --running and stop find", "err", err)
		return
	}
	s.f.announced = a
}
