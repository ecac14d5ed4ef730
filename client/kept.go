package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/oac/sandbox-agent/api"
)

// KeptSpec says how to make a kept sandbox (oac-shim create): its
// provider and what the provider makes its state with. Start it with
// Start or StartReady and Options{Name: NAME, Kept: true}.
type KeptSpec struct {
	Name string
	// Provider is --provider (default: the shim's, bwrap).
	Provider string
	// Rootfs is --rootfs (default: the provider's default root).
	Rootfs string
	// Agent is --agent (default: oac-guest beside oac-shim).
	Agent string
	// SandboxIO and Install put host binaries in the guest's
	// /usr/local/bin at every start (--sandbox-io, --install NAME=PATH).
	SandboxIO string
	Install   []string
	// Args are more create flags (the provider's own), appended last.
	Args []string
}

// CreateKept records a kept sandbox and lets its provider make the
// state it keeps, booting nothing (oac-shim create). A create that
// fails leaves nothing.
func CreateKept(ctx context.Context, o Sandboxes, k KeptSpec) error {
	args := []string{"create", "--name", k.Name}
	add := func(flag, v string) {
		if v != "" {
			args = append(args, flag, v)
		}
	}
	add("--provider", k.Provider)
	add("--rootfs", k.Rootfs)
	add("--agent", k.Agent)
	add("--sandbox-io", k.SandboxIO)
	for _, v := range k.Install {
		args = append(args, "--install", v)
	}
	_, err := o.run(ctx, append(args, k.Args...)...)
	return err
}

// ResetKept takes a kept sandbox back to its image, keeping its name and
// record (oac-shim reset); agent is --agent (empty: beside oac-shim). A
// running one is refused: stop it first, or use Shim.Reset.
func ResetKept(ctx context.Context, o Sandboxes, name, agent string) error {
	args := []string{"reset", "--name", name}
	if agent != "" {
		args = append(args, "--agent", agent)
	}
	_, err := o.run(ctx, args...)
	return err
}

// DestroyKept removes every byte of a kept sandbox (oac-shim destroy).
// A running one is refused: stop it first.
func DestroyKept(ctx context.Context, o Sandboxes, name string) error {
	_, err := o.run(ctx, "destroy", "--name", name)
	return err
}

// ListKept returns the kept sandboxes of the keep root with their state,
// size and whether a shim holds them now (oac-shim list --json).
func ListKept(ctx context.Context, o Sandboxes) (api.ListReport, error) {
	var rep api.ListReport
	out, err := o.run(ctx, "list", "--json")
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, fmt.Errorf("client: oac-shim list --json printed what is not its report (a shim of another release?): %w", err)
	}
	return rep, nil
}
