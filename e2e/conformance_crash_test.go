//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/crashpoint"
)

// The crash-point matrix of TestConformance: on every row, every command
// is killed (SIGKILL, by the shim built with -tags crashpoints) at every
// crash point it passes, and the next command on the name must say what
// it found and leave what the point promises (crashpoint.Outcome): the
// state before the crashed command, nothing, or the command's work done.
// The cells come from crashpoint.Points, so a point declared there is a
// cell here; a point whose command has no runner below fails its cells.

// crashCell is one command killed at one point.
type crashCell struct {
	command string
	point   crashpoint.Point
}

func (c crashCell) String() string { return c.command + " at " + c.point.Name() }

// crashCells are the matrix's cells, in the order of the points.
func crashCells() []crashCell {
	var cells []crashCell
	for _, p := range crashpoint.Points() {
		for _, cmd := range p.Commands() {
			cells = append(cells, crashCell{command: cmd, point: p})
		}
	}
	return cells
}

// crashRunners run a cell of each command.
var crashRunners = map[string]func(t *testing.T, c *confCase, cell crashCell){
	"create":  crashCreate,
	"run":     crashRun,
	"start":   crashStart,
	"reset":   crashReset,
	"destroy": crashDestroy,
}

// runCrashMatrix runs every cell on the row, in order.
func runCrashMatrix(t *testing.T, c *confCase, res *confResults) {
	for _, cell := range crashCells() {
		if c.env.crashCell != nil && !c.env.crashCell(cell) {
			continue
		}
		if cell.point.Name() == crashpoint.ClaimMounted.Name() && !c.env.claimVolumes {
			continue // a claim brings no volume on this row: the point is never reached
		}
		run := crashRunners[cell.command]
		ok := t.Run("crash "+cell.String(), func(t *testing.T) {
			require.NotNil(t, run, "no runner for command %q of crash point %s: add one to crashRunners", cell.command, cell.point.Name())
			run(t, c, cell)
		})
		res.setCrash(c.row.name, cell.String(), map[bool]string{true: "pass", false: "FAIL"}[ok])
	}
	if c.kept.crashName != "" {
		c.destroyAndCheck(t, c.kept.crashName)
	}
}

// crashEnv is the environment that kills the crash shim at cell's point.
func crashEnv(cell crashCell) []string {
	return []string{crashpoint.EnvVar + "=" + cell.point.Name()}
}

// killedAt asserts that the process ended by SIGKILL at cell's point.
func killedAt(t *testing.T, cell crashCell, st *os.ProcessState, stderr string) {
	t.Helper()
	ws, ok := st.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "oac-shim %s was killed at %s (it ended: %s)", cell.command, cell.point.Name(), st)
	require.Contains(t, stderr, "crash point "+cell.point.Name(), "the kill was the crash point's")
}

// crashedCmd runs a short command (create, reset, destroy) of the crash
// shim, killed at cell's point.
func (c *confCase) crashedCmd(t *testing.T, cell crashCell, args ...string) {
	t.Helper()
	_, errOut, st := c.shimCmdAs(t, c.env.spec.crashShim(), crashEnv(cell), args...)
	killedAt(t, cell, st, errOut)
}

// crashShim is the crash build beside the row's shim.
func (s sandboxSpec) crashShim() string {
	if s.shim == "" {
		return bins.crashShim
	}
	return filepath.Join(filepath.Dir(s.shim), filepath.Base(bins.crashShim))
}

// crashedBoot runs oac-shim run or start of name with the crash shim,
// killed at cell's point.
func (c *confCase) crashedBoot(t *testing.T, cell crashCell, name string) (vol string) {
	t.Helper()
	spec := c.runSpec(t, name)
	if cell.command == "start" {
		spec = c.keptStartSpec(t, name)
	}
	var cmds *os.File
	claim := ""
	warm := strings.HasPrefix(cell.point.Name(), "warm/") || strings.HasPrefix(cell.point.Name(), "claim/")
	if warm {
		// The warm run's points: a run --warm, claimed for claim/.
		var in *os.File
		spec, in, cmds, claim, vol = c.warmRun(t, name, spec)
		defer in.Close()
	}
	spec.shim = spec.crashShim()
	spec.env = append(append([]string(nil), spec.env...), crashEnv(cell)...)
	if strings.HasPrefix(cell.point.Name(), "outlive/") {
		// The outliving shim's points: its journal is what they crash.
		spec.args = append(append([]string(nil), spec.args...), "--outlive-parent")
	}
	s := startShim(c.rowT, spec)
	s.t = t
	if strings.HasPrefix(cell.point.Name(), "claim/") {
		s.waitState(api.StateWarm, c.env.bootTimeout)
		_, err := io.WriteString(cmds, claim+"\n")
		require.NoError(t, err)
	}
	if strings.HasPrefix(cell.point.Name(), "stop/") {
		// The stop's points: a sandbox that ran stops.
		s.waitState(api.StateReady, c.env.bootTimeout)
		s.signal(syscall.SIGTERM)
	}
	select {
	case <-s.done:
	case <-time.After(3 * c.env.bootTimeout):
		t.Fatalf("oac-shim %s did not reach crash point %s within %s", cell.command, cell.point.Name(), 3*c.env.bootTimeout)
	}
	killedAt(t, cell, s.cmd.ProcessState, s.stderr.String())
	return vol
}

// runSpec is how the row runs a throwaway sandbox name, holding its name
// in the row's keep root (which the row's user can write).
func (c *confCase) runSpec(t *testing.T, name string) sandboxSpec {
	spec := c.env.spec
	spec.name, spec.bootstrap = name, confBootstrap(name, c.env.peer)
	spec.args = append(append([]string(nil), spec.args...), "--keep-root", c.keepRoot(t))
	return spec
}

// startFindsNothing runs oac-shim start of name, which must refuse (the sandbox
// is gone) after saying that it discarded what the crash left.
func (c *confCase) startFindsNothing(t *testing.T, name string) {
	t.Helper()
	args := []string{"start", "--name", name, "--keep-root", c.keepRoot(t)}
	if a := c.env.spec.agent; a != "" {
		args = append(args, "--agent", a)
	}
	_, errOut, code := c.shimCmd(t, args...)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code, "start of a sandbox the crash left half made")
	assert.Regexp(t, "(discarded kept sandbox "+name+": a shim was killed while it was (creating|resetting|destroying) it|removed what a killed oac-shim left of "+name+")", errOut, "the next command says what it found and did")
	assert.Contains(t, errOut, "nothing of it is left")
	assert.Contains(t, errOut, "no such kept sandbox: "+name)
	c.goneFromKeepRoot(t, name)
	c.nothingLeft(t, name, nil)
}

func (c *confCase) goneFromKeepRoot(t *testing.T, name string) {
	t.Helper()
	_, err := os.Lstat(filepath.Join(c.keepRoot(t), "sandboxes", name))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing of %s is left in the keep root", name)
	assert.NotContains(t, c.listed(t), name)
}

// destroyAndCheck destroys a kept sandbox and checks nothing is left.
func (c *confCase) destroyAndCheck(t *testing.T, name string) {
	t.Helper()
	_, errOut, code := c.shimCmd(t, "destroy", "--name", name, "--keep-root", c.keepRoot(t))
	assert.Zero(t, code, "oac-shim destroy: %s", errOut)
	c.goneFromKeepRoot(t, name)
	c.nothingLeft(t, name, nil)
}

// Create: nothing before it, so a crash leaves nothing, or the created
// sandbox when create had only to say so.
func crashCreate(t *testing.T, c *confCase, cell crashCell) {
	name := uniqueName("crash-c")
	c.crashedCmd(t, cell, c.createArgs(t, name)...)
	switch cell.point.Leaves() {
	case crashpoint.Nothing:
		c.startFindsNothing(t, name)
	case crashpoint.Done:
		c.keptBoot(t, name, "absent")
		c.destroyAndCheck(t, name)
	default:
		t.Fatalf("create at %s: no check for outcome %q", cell.point.Name(), cell.point.Leaves())
	}
}

// Run: a throwaway sandbox; before it the name was free, and the next
// run of the name says what it removed, boots and leaves nothing.
func crashRun(t *testing.T, c *confCase, cell crashCell) {
	require.Equal(t, crashpoint.Before, cell.point.Leaves(), "a throwaway sandbox's crash leaves the name free")
	name := uniqueName("crash-r")
	vol := c.crashedBoot(t, cell, name)
	if vol != "" {
		assert.Empty(t, hostMounts(t, vol), "a claim's volume is mounted only in the guest: nothing on the host after the kill")
		assert.FileExists(t, filepath.Join(vol, volumeMarker), "the tenant's volume is untouched")
	}
	if strings.HasPrefix(cell.point.Name(), "outlive/") {
		c.attachFindsTheShimDead(t, name)
	}
	again := startShim(c.rowT, c.runSpec(t, name))
	again.t = t
	again.waitState(api.StateReady, c.env.bootTimeout)
	procs := sandboxProcs(again, name)
	again.signal(syscall.SIGTERM)
	again.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, again.exit(30*time.Second))
	assert.Contains(t, again.stderr.String(), "removed what a killed oac-shim left of "+name, "the next run says what it found and did")
	c.goneFromKeepRoot(t, name)
	c.nothingLeft(t, name, procs)
}

// Start: the row's crash sandbox (created and started once, its files
// written) is killed while starting or running, and the next start finds
// what it kept.
func crashStart(t *testing.T, c *confCase, cell crashCell) {
	require.Equal(t, crashpoint.Before, cell.point.Leaves(), "a start's crash leaves the kept sandbox as it was")
	name := c.crashSandbox(t)
	c.crashedBoot(t, cell, name)
	e := c.listed(t)[name]
	require.NotNil(t, e, "the kept sandbox is still listed")
	assert.Contains(t, []string{"created", "stopped"}, e["state"], "list says how the sandbox is now")
	s := c.keptBoot(t, name, "kept")
	kept := s.find(func(e api.Event) bool {
		return e.Event == api.KindKept && strings.Contains(e.Message, "was running when its shim was killed")
	})
	if cell.point.Name() != crashpoint.StartClaimed.Name() {
		assert.NotEmpty(t, kept, "the next start says the sandbox's shim was killed while it ran")
	} else {
		assert.Empty(t, kept, "killed before it recorded the start: nothing to say")
	}
}

// crashSandbox is the row's kept sandbox for the start cells, created
// and started once so that its files exist.
func (c *confCase) crashSandbox(t *testing.T) string {
	t.Helper()
	if c.kept.crashName != "" {
		return c.kept.crashName
	}
	name := uniqueName("crash-s")
	_, errOut, code := c.shimCmd(t, c.createArgs(t, name)...)
	require.Zero(t, code, "oac-shim create: %s", errOut)
	c.kept.crashName = name
	c.keptBoot(t, name, "absent")
	return name
}

// Reset: the next command finds the sandbox discarded, or reset done.
func crashReset(t *testing.T, c *confCase, cell crashCell) {
	name := uniqueName("crash-rs")
	_, errOut, code := c.shimCmd(t, c.createArgs(t, name)...)
	require.Zero(t, code, "oac-shim create: %s", errOut)
	args := []string{"reset", "--name", name, "--keep-root", c.keepRoot(t)}
	if a := c.env.spec.agent; a != "" {
		args = append(args, "--agent", a)
	}
	c.crashedCmd(t, cell, args...)
	switch cell.point.Leaves() {
	case crashpoint.Nothing:
		c.startFindsNothing(t, name)
	case crashpoint.Done:
		assert.Equal(t, "created", c.listed(t)[name]["state"])
		c.keptBoot(t, name, "absent")
		c.destroyAndCheck(t, name)
	default:
		t.Fatalf("reset at %s: no check for outcome %q", cell.point.Name(), cell.point.Leaves())
	}
}

// Destroy: the next command finishes it.
func crashDestroy(t *testing.T, c *confCase, cell crashCell) {
	require.Equal(t, crashpoint.Nothing, cell.point.Leaves(), "a destroy's crash leaves nothing once the next command ran")
	name := uniqueName("crash-d")
	_, errOut, code := c.shimCmd(t, c.createArgs(t, name)...)
	require.Zero(t, code, "oac-shim create: %s", errOut)
	c.crashedCmd(t, cell, "destroy", "--name", name, "--keep-root", c.keepRoot(t))
	c.startFindsNothing(t, name)
}

// crashTable renders the matrix: a line per cell with what the point
// promises, a column per row.
func (r *confResults) crashTable() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("| command at crash point | next command finds |")
	for _, row := range confRows {
		b.WriteString(" " + row.name + " |")
	}
	b.WriteString("\n|---|---|")
	for range confRows {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, cell := range crashCells() {
		fmt.Fprintf(&b, "| %s | %s |", cell, cell.point.Leaves())
		for _, row := range confRows {
			out := r.crash[cell.String()][row.name]
			if out == "" {
				out = "not run"
			}
			b.WriteString(" " + out + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *confResults) setCrash(row, cell, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.crash[cell] == nil {
		r.crash[cell] = map[string]string{}
	}
	r.crash[cell][row] = outcome
}

// attachFindsTheShimDead: oac-shim attach of an outliving shim killed at
// outlive/torn-line gives the journal's whole lines, none of them the
// torn ready, says the last line is torn and the shim died, and exits
// api.ExitShimDied; the next run of the name finds what the shim left.
func (c *confCase) attachFindsTheShimDead(t *testing.T, name string) {
	t.Helper()
	out, errOut, code := c.shimCmd(t, "attach", name, "--keep-root", c.keepRoot(t))
	assert.Equal(t, api.ExitShimDied, code, "attach of a killed shim: %s", errOut)
	assert.Contains(t, errOut, "the journal's last line is torn")
	assert.Contains(t, errOut, "died without a final state")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.NotEmpty(t, lines[0], "the events before the kill")
	for i, l := range lines {
		validLine(t, []byte(l))
		var e api.Event
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		assert.Equal(t, uint64(i+1), e.Seq, "%s", l)
		assert.NotEqual(t, api.StateReady, e.State, "the torn ready line is not given")
	}
}
