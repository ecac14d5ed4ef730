//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// The kept-sandbox columns of TestConformance: oac-shim create, start
// (twice), reset, destroy, and a create killed half way. The first three
// act on one sandbox, in order; each row keeps it under a keep root of
// its own.

// keptFiles are what the daemon stand-in writes in a kept sandbox: a file
// in the workspace (/home and /environment) and a package-like file
// under /usr/local.
var keptFiles = []string{
	"/home/runtime/conformance-kept",
	"/environment/workspace/conformance-kept",
	"/usr/local/lib/oac-conformance/package-file",
}

// startOnlyFlags are the row flags oac-shim start takes; the others
// (provider flags, --rootfs, installs) are create's.
var startOnlyFlags = map[string]bool{
	"--tenant": true, "--environment": true, "--allocation": true, "--upstream": true,
	"--boot-timeout": true, "--allow": true, "--timeout": true,
}

// splitKept splits a row's run flags (each "--flag value") into create's
// and start's.
func splitKept(args []string) (create, start []string) {
	for i := 0; i+1 < len(args); i += 2 {
		if startOnlyFlags[args[i]] {
			start = append(start, args[i], args[i+1])
		} else {
			create = append(create, args[i], args[i+1])
		}
	}
	return create, start
}

// keptState is a row's kept sandbox, shared by its columns.
type keptState struct {
	root  string
	name  string
	procs []procID
	// crashName is the crash matrix's kept sandbox for its start cells.
	crashName string
}

// keepRoot is the row's keep root: searchable by others (the guest's
// root is an unprivileged host id) and the row's shim user's.
func (c *confCase) keepRoot(t *testing.T) string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept.root != "" {
		return c.kept.root
	}
	d, err := os.MkdirTemp("", "oac-e2e-keep-")
	require.NoError(t, err)
	c.rowT.Cleanup(func() { os.RemoveAll(d) })
	require.NoError(t, os.Chmod(d, 0o711))
	if c.env.spec.user != "" {
		u, err := user.Lookup(c.env.spec.user)
		require.NoError(t, err)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(d, uid, gid))
	}
	c.kept.root = d
	return d
}

// shimCmd runs a short oac-shim command as the row runs its shims (its
// binary, user and environment) and returns stdout, stderr and the exit
// code.
func (c *confCase) shimCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	stdout, stderr, st := c.shimCmdAs(t, c.env.spec.shim, nil, args...)
	return stdout, stderr, st.ExitCode()
}

// shimCmdAs is shimCmd with another oac-shim binary (the row's when
// empty) and more environment, returning how the process ended.
func (c *confCase) shimCmdAs(t *testing.T, bin string, env []string, args ...string) (string, string, *os.ProcessState) {
	t.Helper()
	spec := c.env.spec
	if bin == "" {
		bin = bins.shim
	}
	argv := append([]string{bin}, args...)
	if spec.user != "" {
		argv = asUser(spec.user, append(append([]string(nil), spec.env...), env...), argv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), spec.env...), env...)
	cmd.Dir = "/"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("oac-shim %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("oac-shim %s: %s\n%s%s", args[0], cmd.ProcessState, stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), cmd.ProcessState
}

// createArgs are oac-shim create's arguments for a kept sandbox called
// name of the row.
func (c *confCase) createArgs(t *testing.T, name string) []string {
	spec := c.env.spec
	agent := spec.agent
	if agent == "" {
		agent = bins.guest
	}
	create, _ := splitKept(spec.args)
	return append([]string{"create", "--provider", spec.provider, "--name", name, "--agent", agent, "--keep-root", c.keepRoot(t)}, create...)
}

// keptBoot starts the kept sandbox, checks that each keptFiles holds want
// ("absent" or "kept") as the workload sees it, lets it write them, and
// stops it.
func (c *confCase) keptBoot(t *testing.T, name, want string) *shim {
	t.Helper()
	s := startShim(c.rowT, c.keptStartSpec(t, name))
	s.t = t
	defer func() {
		// A start that failed ends here, and its lock with it, before
		// the next column acts on the sandbox.
		if !s.exited() {
			_ = s.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
			}
		}
	}()
	// A kept start may do more than a throwaway one's (a VM checks and
	// mounts its kept disk): twice the row's bound.
	s.waitState(api.StateReady, 2*c.env.bootTimeout)
	c.kept.procs = append(c.kept.procs, sandboxProcs(s, name)...)
	for _, f := range keptFiles {
		assert.Equal(t, want, s.waitLog("daemon: persist "+f+"=", bootTimeout), "what the workload finds at %s", f)
		assert.Equal(t, "ok", s.waitLog("daemon: persisted "+f+"=", bootTimeout), "the workload writes %s", f)
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	return s
}

// keptStartSpec is how the row starts its kept sandbox name: start's
// flags, and a daemon that reports and writes keptFiles.
func (c *confCase) keptStartSpec(t *testing.T, name string) sandboxSpec {
	spec := c.env.spec
	spec.name, spec.command = name, "start"
	_, start := splitKept(spec.args)
	spec.args = append(start, "--keep-root", c.keepRoot(t))
	var persist []string
	for _, f := range keptFiles {
		persist = append(persist, "--persist", f)
	}
	spec.bootstrap = confBootstrap(name, c.env.peer, persist...)
	return spec
}

// listed returns the kept sandboxes oac-shim list --json shows, by name.
func (c *confCase) listed(t *testing.T) map[string]map[string]any {
	t.Helper()
	out, errOut, code := c.shimCmd(t, "list", "--json", "--keep-root", c.keepRoot(t))
	require.Zero(t, code, errOut)
	var rep struct {
		Sandboxes []map[string]any `json:"sandboxes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	m := map[string]map[string]any{}
	for _, e := range rep.Sandboxes {
		m[e["name"].(string)] = e
	}
	return m
}

// throwawayRefused runs a throwaway sandbox (oac-shim run, the row's
// flags) named as the kept sandbox name: it must be refused with
// invalid_config before anything is created, and the kept sandbox's next
// start still finds what it wrote.
func (c *confCase) throwawayRefused(t *testing.T, name string) {
	t.Helper()
	spec := c.env.spec
	args := append([]string{"run", "--provider", spec.provider, "--name", name, "--keep-root", c.keepRoot(t)}, spec.args...)
	if spec.agent != "" {
		args = append(args, "--agent", spec.agent)
	}
	_, errOut, code := c.shimCmd(t, args...)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code, "oac-shim run of a kept sandbox's name")
	assert.Contains(t, errOut, "a kept sandbox named "+name+", nothing created")
}

func promiseKeptSurvives(t *testing.T, c *confCase) {
	name := uniqueName("conf-keep")
	_, errOut, code := c.shimCmd(t, c.createArgs(t, name)...)
	require.Zero(t, code, "oac-shim create: %s", errOut)
	c.kept.name = name
	c.keptBoot(t, name, "absent")
	c.throwawayRefused(t, name)
	c.keptBoot(t, name, "kept")
	e := c.listed(t)[name]
	require.NotNil(t, e, "listed")
	assert.Equal(t, "stopped", e["state"])
	assert.Positive(t, e["size_bytes"])
}

func promiseKeptReset(t *testing.T, c *confCase) {
	name := c.kept.name
	require.NotEmpty(t, name, "the kept column's sandbox was created")
	args := []string{"reset", "--name", name, "--keep-root", c.keepRoot(t)}
	if a := c.env.spec.agent; a != "" {
		args = append(args, "--agent", a)
	}
	_, errOut, code := c.shimCmd(t, args...)
	require.Zero(t, code, "oac-shim reset: %s", errOut)
	e := c.listed(t)[name]
	require.NotNil(t, e, "the sandbox is still there")
	assert.Equal(t, "created", e["state"])
	c.keptBoot(t, name, "absent")
}

func promiseKeptDestroy(t *testing.T, c *confCase) {
	name := c.kept.name
	require.NotEmpty(t, name, "the kept column's sandbox was created")
	_, errOut, code := c.shimCmd(t, "destroy", "--name", name, "--keep-root", c.keepRoot(t))
	require.Zero(t, code, "oac-shim destroy: %s", errOut)
	assert.NotContains(t, c.listed(t), name)
	_, err := os.Lstat(filepath.Join(c.keepRoot(t), "sandboxes", name))
	assert.ErrorIs(t, err, os.ErrNotExist, "its kept directory is gone")
	c.nothingLeft(t, name, c.kept.procs)
}
