package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// Sandboxes says where a parent's running sandboxes are: the sandboxes
// its shims run under one keep root (every oac-shim run and start
// announces itself there), listed and stopped by short oac-shim commands.
type Sandboxes struct {
	// Shim is the oac-shim binary (default: $OAC_SHIM, else oac-shim in PATH).
	Shim string
	// KeepRoot is --keep-root (default: the shim's).
	KeepRoot string
	// Env is the shim's environment (nil: this process's).
	Env []string
}

// ErrNotAllStopped: a sandbox asked for was not stopped in order (killed,
// or could not be stopped); the report says which and why.
var ErrNotAllStopped = errors.New("not every sandbox stopped in order")

// List returns the running sandboxes with their control sockets
// (oac-shim list --running --json); the records of dead shims it found
// are removed and listed as Cleaned.
func List(ctx context.Context, o Sandboxes) (api.RunningReport, error) {
	var rep api.RunningReport
	out, err := o.run(ctx, "list", "--running", "--json")
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, fmt.Errorf("client: oac-shim list --running: %w", err)
	}
	return rep, nil
}

// StopAll stops every running sandbox in order (oac-shim stop --all),
// giving each shim grace (0: the shim's default) to exit, and returns
// what happened to each. The error wraps ErrNotAllStopped when one was
// killed or could not be stopped.
func StopAll(ctx context.Context, o Sandboxes, grace time.Duration) (api.StopReport, error) {
	return o.stop(ctx, grace, "--all")
}

// StopNamed stops the named running sandboxes in order (oac-shim stop
// NAME...); a name no shim runs is reported not_running, which is no
// error.
func StopNamed(ctx context.Context, o Sandboxes, grace time.Duration, names ...string) (api.StopReport, error) {
	if len(names) == 0 {
		return api.StopReport{}, errors.New("client: name the sandboxes to stop (StopAll stops every one)")
	}
	return o.stop(ctx, grace, names...)
}

func (o Sandboxes) stop(ctx context.Context, grace time.Duration, what ...string) (api.StopReport, error) {
	args := []string{"stop", "--json"}
	if grace > 0 {
		args = append(args, "--grace", grace.String())
	}
	var rep api.StopReport
	out, err := o.run(ctx, append(args, what...)...)
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1 && len(out) > 0) {
		return rep, err
	}
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return rep, fmt.Errorf("client: oac-shim stop: %w", jerr)
	}
	if !rep.AllStopped {
		var not []string
		for _, e := range rep.Sandboxes {
			if e.Outcome != api.StopStopped && e.Outcome != api.StopNotRunning {
				not = append(not, e.Name+" "+string(e.Outcome))
			}
		}
		return rep, fmt.Errorf("client: %w: %s", ErrNotAllStopped, strings.Join(not, ", "))
	}
	return rep, nil
}

// run runs a short oac-shim command and returns its stdout; a failure's
// error carries its stderr and, unwrapped, the *exec.ExitError.
func (o Sandboxes) run(ctx context.Context, args ...string) ([]byte, error) {
	shim := shimPath(o.Shim)
	if o.KeepRoot != "" {
		args = append(args[:1:1], append([]string{"--keep-root", o.KeepRoot}, args[1:]...)...)
	}
	cmd := exec.CommandContext(ctx, shim, args...)
	cmd.Env = o.Env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("client: oac-shim %s: %w (%s)", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
