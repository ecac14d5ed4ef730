package client

import (
	"context"
	"errors"
	"io"
	"strconv"

	"github.com/oac/sandbox-agent/api"
)

// AttachOptions say which sandbox to attach to and from where.
type AttachOptions struct {
	// Shim is the oac-shim binary (default: $OAC_SHIM, else oac-shim in PATH).
	Shim string
	// Name is the sandbox's name: one started with Options.Outlive.
	Name string
	// KeepRoot is --keep-root (default: the shim's): the one it runs under.
	KeepRoot string
	// From is where the events begin: the zero From is the oldest the
	// sandbox's journal keeps, FromSeq(n) the event of seq n (the last
	// one a parent saw, plus one), FromNow() the next one.
	From From
	// History, Env, Stderr and OnEvent are as in Options.
	History int
	Env     []string
	Stderr  io.Writer
	OnEvent func(api.Event)
}

// Attach takes up a sandbox that outlives its parent (Options.Outlive)
// from another process, or the same one after a restart: it launches
// `oac-shim attach NAME`, whose stdout replays the sandbox's events from
// o.From and then follows them, and whose stdin carries control commands.
// The returned Shim is used as Start's is: Events, WaitState, Status,
// Stop (which stops the sandbox); Close and Kill end only the attach,
// and the sandbox runs on. ctx bounds only the launch.
//
// When nothing runs the name (or it runs without Outlive) the attach
// exits at once: the first wait returns an *ExitedError with status 10
// and what oac-shim said; 11 when the sandbox's shim died.
func Attach(ctx context.Context, o AttachOptions) (*Shim, error) {
	if o.Name == "" {
		return nil, errors.New("client: name the sandbox to attach to (AttachOptions.Name)")
	}
	args := []string{"attach", o.Name}
	switch {
	case o.From.now:
		args = append(args, "--from", "now")
	case o.From.seq > 0:
		args = append(args, "--from", strconv.FormatUint(o.From.seq, 10))
	}
	if o.KeepRoot != "" {
		args = append(args, "--keep-root", o.KeepRoot)
	}
	s, err := launch(ctx, launchSpec{shim: o.Shim, args: args, env: o.Env, stderr: o.Stderr, onEvent: o.OnEvent, history: o.History})
	if err != nil {
		return nil, err
	}
	s.name, s.attached = o.Name, true
	return s, nil
}
