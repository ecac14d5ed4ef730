package oci

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
)

// Runtimes.
const (
	RuntimeRunc = "runc"
	RuntimeCrun = "crun"
)

// CgroupLayout is how the host mounts cgroups.
type CgroupLayout string

// Layouts.
const (
	CgroupV1      CgroupLayout = "v1"
	CgroupHybrid  CgroupLayout = "hybrid" // v1 controllers plus a cgroup2 mount below /sys/fs/cgroup
	CgroupV2      CgroupLayout = "v2"
	CgroupUnknown CgroupLayout = "unknown"
)

// Facts decide whether and how the OCI provider runs here; the Linux code
// gathers them, Diagnose judges them.
type Facts struct {
	Root bool
	// Runtime is what --runtime asked for ("" picks runc, then crun);
	// RuntimePath is the binary found for it ("" when none).
	Runtime, RuntimePath string
	Layout               CgroupLayout
	// Unified is the cgroup2 mount point of a hybrid layout.
	Unified string
	// Sh and Umount are needed to hide Unified from crun.
	Sh, Umount string
}

// runtimeCmd runs one OCI runtime binary.
type runtimeCmd struct {
	Kind string // runc or crun
	Path string
	// HideCgroup2 is a cgroup2 mount point to unmount in a private mount
	// namespace before the runtime runs: crun 1.8 refuses a hybrid layout
	// ("cgroups in hybrid mode not supported") but runs as on a v1 host
	// when it cannot see the cgroup2 mount (measured; docs/providers.md).
	HideCgroup2 string
	Sh, Umount  string
}

// Kind returns the runtime kind of a binary path or name ("" when neither
// runc nor crun).
func Kind(pathOrName string) string {
	switch filepath.Base(pathOrName) {
	case RuntimeRunc:
		return RuntimeRunc
	case RuntimeCrun:
		return RuntimeCrun
	}
	return ""
}

// argv returns the command line that runs the runtime with args. With
// HideCgroup2 the runtime runs under sh, which unmounts the cgroup2 mount
// first; the caller starts it in a new, private mount namespace.
func (r runtimeCmd) argv(args ...string) []string {
	if r.HideCgroup2 == "" {
		return append([]string{r.Path}, args...)
	}
	return append([]string{r.Sh, "-c", `"$0" -l -- "$1" && shift && exec "$@"`, r.Umount, r.HideCgroup2, r.Path}, args...)
}

// runArgs, killArgs, deleteArgs are the runtime's subcommands.
func runArgs(bundle, id string) []string {
	return []string{"run", "--bundle", bundle, "--no-new-keyring", id}
}
func killArgs(id string) []string   { return []string{"kill", id, "KILL"} }
func deleteArgs(id string) []string { return []string{"delete", "--force", id} }

// Problem is one reason the provider cannot run, with what to do about it.
type Problem struct{ Cause, Fix string }

func (p Problem) String() string { return p.Cause + ": " + p.Fix }

// Diagnose decides the runtime command for f, or lists every problem.
func Diagnose(f Facts) (runtimeCmd, []Problem) {
	var ps []Problem
	rt := runtimeCmd{Path: f.RuntimePath, Kind: Kind(f.RuntimePath), Sh: f.Sh, Umount: f.Umount}
	if rt.Kind == "" && f.RuntimePath != "" {
		rt.Kind = Kind(f.Runtime)
	}
	switch {
	case f.RuntimePath == "" && f.Runtime == "":
		ps = append(ps, Problem{"no OCI runtime is installed", "apt-get install runc (or crun)"})
	case f.RuntimePath == "":
		ps = append(ps, Problem{fmt.Sprintf("OCI runtime %q is not installed", f.Runtime), "apt-get install " + pkgOf(f.Runtime)})
	case rt.Kind == "":
		ps = append(ps, Problem{fmt.Sprintf("%s is neither runc nor crun", f.RuntimePath), "pass --runtime runc or --runtime crun"})
	}
	if !f.Root {
		ps = append(ps, Problem{"the OCI provider runs the runtime as root (rootless runc/crun is not built)",
			"run oac-shim as root, or use the bwrap provider, which runs rootless"})
	}
	switch f.Layout {
	case CgroupUnknown:
		ps = append(ps, Problem{"no cgroup filesystem found at /sys/fs/cgroup", "mount cgroups (the pids limit needs them)"})
	case CgroupHybrid:
		if rt.Kind == RuntimeCrun {
			if f.Sh == "" || f.Umount == "" {
				ps = append(ps, Problem{"crun on a hybrid cgroup layout needs sh and umount to hide " + f.Unified, "apt-get install mount dash"})
			}
			rt.HideCgroup2 = f.Unified
		}
	}
	return rt, ps
}

func pkgOf(runtime string) string {
	if k := Kind(runtime); k != "" {
		return k
	}
	return "runc"
}

// problemsError joins problems into one error wrapping ErrUnavailable.
func problemsError(ps []Problem) error {
	var b []string
	for _, p := range ps {
		b = append(b, p.String())
	}
	return fmt.Errorf("%w: oci: %w", provider.ErrUnavailable, errors.New(strings.Join(b, "; ")))
}

// Detail says how sandboxes run with rt.
func (r runtimeCmd) Detail() string {
	s := fmt.Sprintf("%s at %s, guest ids mapped to a private host range", r.Kind, r.Path)
	if r.HideCgroup2 != "" {
		s += "; hybrid cgroups: " + r.HideCgroup2 + " is hidden from crun in a private mount namespace"
	}
	return s
}
