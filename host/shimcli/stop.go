package shimcli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
)

// oac-shim stop NAME and stop --all: each running sandbox's shim (kept's
// Registry) is asked to stop in order, through its control socket when it
// serves one, else (or when that does not answer) by SIGTERM to the
// process proven to be its shim; each is waited for within the grace
// (the shim exits once its sandbox has stopped and been torn down), and
// one that outlives it is killed.

// DefaultStopGrace is how long stop waits for each shim to exit: more than
// a bootstrap's default stop_grace (6s) and the teardown after it.
const DefaultStopGrace = 30 * time.Second

const (
	// controlTimeout bounds dialing a control socket and its answer.
	controlTimeout = 3 * time.Second
	// killWait bounds the wait for a killed shim's exit.
	killWait = 5 * time.Second
	// maxAnswer bounds the stop command's answer read back.
	maxAnswer = 1 << 20
)

// errShimGone: the shim's process has exited (its entry goes with it).
var errShimGone = errors.New("the shim's process has exited")

// errNoProof: this OS gives no way to prove a process is the shim.
var errNoProof = errors.New("this OS gives oac-shim no way to prove which process is the sandbox's shim")

// StopOptions say what Stop does.
type StopOptions struct {
	// Names to stop; All: every running sandbox instead.
	Names []string
	All   bool
	// Grace is how long each shim gets to exit once asked.
	Grace time.Duration
}

// Stop stops the running sandboxes of the registry o names (all of them
// with o.All) and says what happened to each. The shims are asked at once
// and each is waited for within o.Grace from its request.
func Stop(ctx context.Context, g *kept.Registry, o StopOptions) (api.StopReport, error) {
	rep := api.StopReport{SchemaVersion: api.SchemaVersion, GraceMS: o.Grace.Milliseconds(), Sandboxes: []api.StopEntry{}, Cleaned: []api.CleanedEntry{}}
	live, cleaned, err := g.List()
	if err != nil {
		return rep, err
	}
	rep.Cleaned = append(rep.Cleaned, cleaned...)
	names := o.Names
	if o.All {
		names = nil
		for _, r := range live {
			names = append(names, r.Record.Name)
		}
	}
	entries := make([]api.StopEntry, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entries[i] = stopOne(ctx, g, name, o.Grace)
		}()
	}
	wg.Wait()
	// A killed shim's entry is a dead shim's: removed now, not at the
	// next listing.
	g.Sweep()
	sort.SliceStable(entries, func(a, b int) bool { return entries[a].Name < entries[b].Name })
	rep.Sandboxes = append(rep.Sandboxes, entries...)
	rep.AllStopped = true
	for _, e := range entries {
		if e.Outcome != api.StopStopped && e.Outcome != api.StopNotRunning {
			rep.AllStopped = false
		}
	}
	return rep, nil
}

// stopOne asks the shim of name to stop and waits for it within grace.
func stopOne(ctx context.Context, g *kept.Registry, name string, grace time.Duration) (e api.StopEntry) {
	e.Name = name
	begin := time.Now()
	defer func() { e.ElapsedMS = time.Since(begin).Milliseconds() }()
	w, err := g.Open(name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		e.Outcome, e.Message = api.StopNotRunning, "no shim runs a sandbox of this name"
		return e
	case err != nil:
		e.Outcome, e.Message = api.StopFailed, fmt.Sprintf("%v; stop its shim yourself (its control API's stop, or SIGTERM)", err)
		return e
	}
	defer w.Close()
	rec := w.Record
	e.PID = rec.PID
	// Proven while its entry is held: the process to signal, and whose
	// exit ends the wait (the entry goes a moment before the process).
	proc, perr := openShim(rec)
	if proc != nil {
		defer proc.close()
	}
	signal := func(sig shimSignal) error {
		if proc == nil {
			return perr
		}
		return proc.signal(sig)
	}
	gone := func() bool { return w.Gone() && (proc == nil || proc.exited()) }
	var why []string
	if rec.ControlSocket != "" {
		if err := askStop(ctx, rec.ControlSocket); err != nil {
			why = append(why, fmt.Sprintf("its control socket did not take the stop command (%v)", err))
		} else {
			e.Via = api.StopViaControl
		}
	} else {
		why = append(why, "it serves no control socket")
	}
	if e.Via == "" {
		switch err := signal(sigTerm); {
		case errors.Is(err, errShimGone):
			why = append(why, "its shim had exited already")
		case err != nil && !gone():
			e.Outcome = api.StopFailed
			e.Message = fmt.Sprintf("%s, and SIGTERM could not be sent: %v", join(why), err)
			return e
		default:
			e.Via = api.StopViaSignal
		}
	}
	if waitGone(ctx, gone, begin.Add(grace)) {
		e.Outcome = api.StopStopped
		if e.Via == api.StopViaSignal {
			e.Message = join(why) + ": stopped by SIGTERM"
		} else if len(why) > 0 {
			e.Message = join(why)
		}
		return e
	}
	why = append(why, fmt.Sprintf("its shim did not exit within the grace of %s", grace))
	switch err := signal(sigKill); {
	case errors.Is(err, errShimGone) && !gone():
		e.Outcome, e.Message = api.StopFailed, join(why)+"; its process is gone, yet its entry is still held (by a process it left?)"
		return e
	case err != nil && !gone():
		e.Outcome, e.Message = api.StopFailed, fmt.Sprintf("%s, and it could not be killed: %v", join(why), err)
		return e
	}
	if !waitGone(ctx, gone, time.Now().Add(killWait)) {
		e.Outcome, e.Message = api.StopFailed, join(why)+", and it was killed but has not exited"
		return e
	}
	e.Outcome, e.Message = api.StopKilled, join(why)+": killed (SIGKILL)"
	return e
}

func join(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}

// waitGone waits until gone says the shim has exited or deadline passes
// (or ctx ends), backing off from 5 ms to 100 ms.
func waitGone(ctx context.Context, gone func() bool, deadline time.Time) bool {
	backoff := 5 * time.Millisecond
	for {
		if gone() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		t := time.NewTimer(min(backoff, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return gone()
		case <-t.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// askStop sends the stop command on a control socket and reads its
// answer: nil when the shim took it.
func askStop(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write([]byte(`{"id":"stop","cmd":"stop"}` + "\n")); err != nil {
		return err
	}
	br := bufio.NewReaderSize(io.LimitReader(c, maxAnswer), 64<<10)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	var a struct {
		ID    string `json:"id"`
		OK    bool   `json:"ok"`
		Code  string `json:"code"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(line, &a); err != nil {
		return errors.New("the answer is not JSON")
	}
	if !a.OK {
		if a.Code == api.AnswerStopping {
			return nil // stopping already: as good as taken
		}
		return fmt.Errorf("refused: %s", a.Code)
	}
	return nil
}

// stopCmd is oac-shim stop NAME... or stop --all.
func stopCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-shim stop")
	keepRoot := fs.String("keep-root", "", "the keep root whose running sandboxes to stop (default "+persist.DefaultRoot()+")")
	all := fs.Bool("all", false, "stop every running sandbox of the keep root")
	grace := fs.Duration("grace", DefaultStopGrace, "how long each shim gets to exit once asked; one that outlives it is killed")
	asJSON := fs.Bool("json", false, "print one JSON object (schema/stop.schema.json)")
	fs.String("name", "", "the sandbox's name, as a NAME argument (as the other commands take it)")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	names, err := cli.Names(fs, args)
	if err != nil {
		return cli.Usagef(fs, stderr, "%v", err)
	}
	switch {
	case *all && len(names) > 0:
		fmt.Fprintln(stderr, "oac-shim stop: give NAME... or --all, not both")
		return 2
	case !*all && len(names) == 0:
		fmt.Fprintln(stderr, "oac-shim stop: give the NAME of a running sandbox, or --all")
		return 2
	case *grace <= 0:
		fmt.Fprintln(stderr, "oac-shim stop: --grace must be positive")
		return 2
	}
	for _, n := range names {
		if !provider.ValidName(n) {
			fmt.Fprintf(stderr, "oac-shim stop: %q is not a sandbox name (1 to 63 characters of a-z, 0-9 and '-')\n", n)
			return 2
		}
	}
	rep, err := Stop(context.Background(), kept.OpenRegistry(*keepRoot), StopOptions{Names: names, All: *all, Grace: *grace})
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim stop: %v\n", err)
		return 1
	}
	for _, e := range rep.Cleaned {
		fmt.Fprintf(stderr, "oac-shim: %s: %s\n", e.Name, e.Message)
	}
	if *asJSON {
		printJSON(stdout, rep)
	} else {
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tOUTCOME\tVIA\tTOOK\tMESSAGE")
		for _, e := range rep.Sandboxes {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.Name, e.Outcome, orDash(e.Via), time.Duration(e.ElapsedMS)*time.Millisecond, e.Message)
		}
		_ = w.Flush()
	}
	if !rep.AllStopped {
		return 1
	}
	return 0
}
