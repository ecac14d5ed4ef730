package bwrap

import (
	"errors"
	"fmt"
	"strings"
)

// Facts are what decides whether and how bwrap can run for this user; the
// OS-specific code gathers them, Diagnose judges them.
type Facts struct {
	BwrapPath string // empty: not installed
	Root      bool
	User      string
	UID, GID  int
	// Sysctls; -1 when the file does not exist on this kernel.
	UnprivUsernsClone  int // kernel.unprivileged_userns_clone (Debian, older Ubuntu)
	MaxUserNamespaces  int // user.max_user_namespaces
	AppArmorRestrict   int // kernel.apparmor_restrict_unprivileged_userns (Ubuntu 23.10+)
	BwrapProfileUserns bool
	SubUIDs, SubGIDs   []IDRangeEntry
	NewUIDMap          string // path of newuidmap, empty when missing
	NewGIDMap          string
	SingleUIDAllowed   bool // the user passed --single-uid

	// Where the kernel enforces AppArmor. BwrapProfile names the profile
	// file in /etc/apparmor.d that attaches to bwrap's path ("" none).
	BwrapProfile string
	// ChildLabel is the AppArmor label bwrap's child ran under in the
	// capability probe, ChildCapsDenied the kernel's refusal of its mount
	// in its own namespace ("" allowed, or no probe), ProbeErr why bwrap
	// did not run the probe's child ("" it did).
	ChildLabel, ChildCapsDenied, ProbeErr string
}

// Mode is how the provider builds the guest's user namespace.
type Mode int

// Modes.
const (
	// ModeRoot: oac-shim is root and maps a private host id range.
	ModeRoot Mode = iota
	// ModeSubIDs: rootless; guest root is the user, guest ids from 1 on are
	// the user's subordinate ids, mapped by newuidmap/newgidmap.
	ModeSubIDs
	// ModeSingleUID: rootless without subordinate ids, on request only:
	// guest uid 1000 is the user and there is no guest root.
	ModeSingleUID
)

func (m Mode) String() string {
	return [...]string{"root", "subordinate-ids", "single-uid"}[m]
}

// SingleUIDLoss says plainly what --single-uid gives up.
const SingleUIDLoss = "single-uid mode: guest uid 1000 is your own host uid and the agent runs as that same uid " +
	"without a guest root, so the daemon is not a distinct identity from the agent and can signal it " +
	"(not trace it or read its memory: the agent is not dumpable and the workload's seccomp filter refuses ptrace)"

// Problem is one reason bwrap cannot run, with what to do about it.
type Problem struct {
	Cause string
	Fix   string
}

func (p Problem) String() string { return p.Cause + ": " + p.Fix }

// Diagnose decides the mode for f, or lists every problem found.
func Diagnose(f Facts) (Mode, []Problem) {
	var ps []Problem
	if f.BwrapPath == "" {
		ps = append(ps, Problem{"bubblewrap is not installed", "apt-get install bubblewrap"})
	}
	if f.MaxUserNamespaces == 0 {
		ps = append(ps, Problem{"user namespaces are disabled (user.max_user_namespaces=0)",
			"sysctl -w user.max_user_namespaces=15000 (and persist it in /etc/sysctl.d)"})
	}
	if f.ChildCapsDenied != "" {
		// Root's bwrap is confined the same way: profiles attach to the
		// binary, whoever runs it.
		ps = append(ps, childCapsProblem(f))
	}
	if f.Root {
		return ModeRoot, ps
	}
	if f.UnprivUsernsClone == 0 {
		ps = append(ps, Problem{"unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)",
			"sysctl -w kernel.unprivileged_userns_clone=1 (and persist it in /etc/sysctl.d)"})
	}
	switch {
	case f.AppArmorRestrict != 1 || f.ChildCapsDenied != "":
	case !f.BwrapProfileUserns:
		ps = append(ps, Problem{"AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1) and no AppArmor profile lets " + f.BwrapPath + " create one",
			ownBwrapFix(f.BwrapPath)})
	case f.ProbeErr != "":
		// The profile's file is there; the kernel did not let bwrap
		// build the sandbox all the same (not loaded, or not this one).
		ps = append(ps, Problem{"AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1) and " + f.ProbeErr,
			fmt.Sprintf("load the profile that should let it: sudo apparmor_parser -r /etc/apparmor.d/%s; or %s", f.BwrapProfile, ownBwrapFix(f.BwrapPath))})
	}
	_, uidOK := pickRange(f.SubUIDs)
	_, gidOK := pickRange(f.SubGIDs)
	helpers := f.NewUIDMap != "" && f.NewGIDMap != ""
	switch {
	case uidOK && gidOK && helpers:
		return ModeSubIDs, ps
	case f.SingleUIDAllowed:
		return ModeSingleUID, ps
	}
	if !helpers {
		ps = append(ps, Problem{"newuidmap/newgidmap are missing", "apt-get install uidmap"})
	}
	if !uidOK || !gidOK {
		ps = append(ps, Problem{fmt.Sprintf("user %s has no subordinate id range of at least 1000 ids in /etc/subuid and /etc/subgid", f.User),
			fmt.Sprintf("sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 %s (pick a range no other user has), or pass --single-uid and accept: %s", f.User, SingleUIDLoss)})
	}
	return ModeSubIDs, ps
}

// OwnBwrap is where a desktop app installs a bwrap of its own: the path
// its AppArmor profile, examples/apparmor/oac-bwrap, attaches to.
const OwnBwrap = "/opt/oac/bin/bwrap"

// OwnBwrapProfile is that profile's name and its file in /etc/apparmor.d.
const OwnBwrapProfile = "oac-bwrap"

// ownBwrapFix says how to give oac a bwrap of its own under
// examples/apparmor/oac-bwrap (docs/ubuntu.md): the profile Ubuntu
// recommends for an application (userns, and otherwise unconfined, so the
// agent keeps its capabilities in its own namespaces). Never Ubuntu's
// bwrap-userns-restrict: its children run under unpriv_bwrap without them.
func ownBwrapFix(bwrap string) string {
	var b strings.Builder
	if bwrap != OwnBwrap {
		fmt.Fprintf(&b, "give oac a bwrap of its own at %s (sudo install -D -m 0755 %s %s: a path no profile of the system attaches to), ", OwnBwrap, orDefault(bwrap, "/usr/bin/bwrap"), OwnBwrap)
	}
	fmt.Fprintf(&b, "install its AppArmor profile (sudo install -m 0644 examples/apparmor/%[1]s /etc/apparmor.d/%[1]s && sudo apparmor_parser -r /etc/apparmor.d/%[1]s)", OwnBwrapProfile)
	if bwrap != OwnBwrap {
		b.WriteString(" (oac-shim takes that bwrap before any in PATH)")
	}
	b.WriteString("; not Ubuntu's bwrap-userns-restrict, which runs bwrap's children without the capabilities the guest agent needs (docs/ubuntu.md)")
	return b.String()
}

// childCapsProblem: a profile runs bwrap's children without capabilities.
func childCapsProblem(f Facts) Problem {
	cause := fmt.Sprintf("AppArmor runs bwrap's children without capabilities (the probe ran as %q and the kernel refused it a mount in its own namespace: %s)", orDefault(f.ChildLabel, "unknown"), f.ChildCapsDenied)
	if f.BwrapProfile != "" {
		cause += fmt.Sprintf(", the profile in /etc/apparmor.d/%s confines %s", f.BwrapProfile, f.BwrapPath)
	}
	cause += ", and the guest agent needs them in its own namespaces (chown, mounts, nftables)"
	return Problem{cause, ownBwrapFix(f.BwrapPath)}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// problemsError joins problems into one error message.
func problemsError(ps []Problem) error {
	var b []string
	for _, p := range ps {
		b = append(b, p.String())
	}
	return errors.New(strings.Join(b, "; "))
}
