package apparmor

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Name is the profile's name, as a container asks for it (docker run
// --security-opt apparmor=oac-guest; a Pod's Localhost appArmorProfile).
const Name = "oac-guest"

// Version is the profile's version, written in its header. Raise it
// whenever the text changes (a rule added or removed, a newer engine
// default), so an operator can tell which one a node holds.
const Version = 1

// MountRule is one mount the workload launcher makes, as one AppArmor
// rule. AppArmor's options=(...) matches the mount's flags exactly, so
// each rule allows that mount and no variant of it.
type MountRule struct {
	// FSType is the new filesystem's type; "" for a bind, a remount or a
	// propagation change.
	FSType string
	// Options are the mount's flags as AppArmor names them.
	Options []string
	// Source is the mount's source ("" for none): a new filesystem's
	// name, or the path a bind mount is made from.
	Source string
	// Target is the mount point; a directory's ends in "/", as AppArmor
	// names it.
	Target string
	// Why says what the launcher makes it for (a comment above it).
	Why string
}

func (r MountRule) String() string {
	s := "mount"
	if r.FSType != "" {
		s += " fstype=" + r.FSType
	}
	s += " options=(" + strings.Join(r.Options, ",") + ")"
	if r.Source != "" {
		s += " " + r.Source
	}
	return s + " -> " + r.Target + ","
}

// The devices the launcher binds into the workload's /dev from the
// container's (guest/workload's devNodes and devDirs, those a runtime
// gives: /dev/ptmx is a symlink into pts/ under runc and crun).
var (
	devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}
	devDirs  = []string{"pts", "shm", "mqueue"}
)

// MountRules are the mounts the workload launcher makes in the user and
// mount namespace of its own that it gives each workload process, in the
// order it makes them (guest/workload: launch, minimalDev, maskFiles), as
// recorded in testdata/launcher-mounts.log. Detaching (umount) is the
// engine default's own `umount,`; nothing pivots its root.
var MountRules = func() []MountRule {
	rules := []MountRule{
		{Options: []string{"rw", "rslave"}, Target: "/",
			Why: "every mount of the new namespace a slave: nothing mounted there propagates back"},
		{FSType: "tmpfs", Options: []string{"rw", "nosuid", "noexec"}, Source: "tmpfs", Target: "/dev/",
			Why: "the workload's /dev: a tmpfs with only the contract's devices, each bound from the container's"},
	}
	for _, n := range devNodes {
		rules = append(rules, MountRule{Options: []string{"rw", "rbind"}, Source: "/dev/" + n, Target: "/dev/" + n})
	}
	for _, d := range devDirs {
		rules = append(rules, MountRule{Options: []string{"rw", "rbind"}, Source: "/dev/" + d + "/", Target: "/dev/" + d + "/"})
	}
	return append(rules,
		MountRule{FSType: "tmpfs", Options: []string{"rw", "nosuid", "nodev", "noexec"}, Source: "tmpfs", Target: "/dev/",
			Why: "the masks: a small tmpfs over /dev for the empty file, made read-only, bound over each file to hide, then detached"},
		MountRule{Options: []string{"ro", "remount", "nosuid", "nodev", "noexec"}, Target: "/dev/"},
		MountRule{Options: []string{"rw", "bind"}, Source: "/dev/masked", Target: bootstrap.SandboxIOFile,
			Why: "the daemon's mask over oac-sandbox-io's private file"},
	)
}()

// Includes says what the profile takes from /etc/apparmor.d, as the
// engine decides it for its own: tunables/global (else @{PROC} is set
// in the profile) and abstractions/base, each where the host has it.
type Includes struct {
	Tunables, Base bool
}

// profileDir is where AppArmor's includes are.
const profileDir = "/etc/apparmor.d"

// HostIncludes are the includes this host has.
func HostIncludes() Includes {
	has := func(p string) bool { _, err := os.Stat(filepath.Join(profileDir, p)); return err == nil }
	return Includes{Tunables: has("tunables/global"), Base: has("abstractions/base")}
}

// Published is the profile as examples/apparmor/oac-guest ships it, for
// hosts with the apparmor package (both includes).
func Published() []byte { return Profile(Includes{Tunables: true, Base: true}) }

// Profile is oac-guest's text with the includes inc.
func Profile(inc Includes) []byte { return Guest.Text(inc) }

// HelperName is the profile of oac-guest helper in a container Docker
// runs from the E2B template (docs/hosted.md).
const HelperName = Name + "-helper"

// HelperMountRules are the mounts the helper itself makes beside its
// launcher's, as recorded in testdata/helper-mounts.log: it runs itself
// again in a mount namespace of its own (package helper) and binds the
// agent's resolv.conf there (guest/initsys.PlaceResolvConf).
var HelperMountRules = []MountRule{
	{Options: []string{"rw", "rprivate"}, Target: "/",
		Why: "oac-guest helper: its own mount namespace, every mount private (Go's runtime after the unshare)"},
	{Options: []string{"rw", "bind"}, Source: "/run/oac/resolv.conf", Target: "/etc/resolv.conf",
		Why: "the agent's resolv.conf over the platform's, in that namespace, read-only"},
	{Options: []string{"ro", "remount", "bind"}, Target: "/etc/resolv.conf"},
}

// Variant is one profile: the engine's default under a name, its deny
// mount replaced by rules.
type Variant struct {
	Name  string
	Rules []MountRule
	// About says, in the header, what runs under it.
	About string
}

var (
	// Guest is oac-guest: the docker provider's containers and the
	// kubernetes provider's Pods.
	Guest = Variant{Name: Name, Rules: MountRules, About: `the AppArmor profile of oac's guest agent in a
# container (oac-shim --provider docker; a Pod of the kubernetes provider,
# --k8s-apparmor-profile ` + Name + `)`}
	// Helper is oac-guest-helper: oac-guest plus the helper's own mounts,
	// for a container of the E2B template that Docker runs.
	Helper = Variant{Name: HelperName, Rules: append(append([]MountRule(nil), MountRules...), HelperMountRules...), About: `the AppArmor profile of oac-guest helper in a
# container Docker runs from the E2B template (docs/hosted.md): ` + Name + `'s
# rules and the helper's own mounts in the namespace it makes for itself`}
	// Variants are the published profiles.
	Variants = []Variant{Guest, Helper}
)

// header heads a profile's text.
func (v Variant) header() string {
	return fmt.Sprintf(`# %[1]s, version %[2]d: %[3]s.
# Generated by oac (package host/apparmor, from the engine's template): do
# not edit; docs/providers.md#apparmor.
#
# It is the Docker engine's default profile, docker-default (the template
# of github.com/moby/profiles/apparmor v0.1.0, which containerd's default
# copies), without its "deny mount,", plus one rule for each mount oac-guest
# was recorded making (below: its workload launcher's, in the user and mount
# namespace it gives each workload process), each with its filesystem type,
# options and target: nothing else. Under the docker and kubernetes
# providers the agent holds no CAP_SYS_ADMIN in the container's own
# namespaces, so there the kernel still refuses it every mount.
#
# Install or upgrade, as root, on each host or node:
#   install -m 0644 %[1]s /etc/apparmor.d/%[1]s
#   apparmor_parser -r /etc/apparmor.d/%[1]s
# Remove (no container may still run under it):
#   apparmor_parser -R /etc/apparmor.d/%[1]s && rm /etc/apparmor.d/%[1]s
`, v.Name, Version, v.About)
}

// denyMount is the engine default's rule the profile replaces.
const denyMount = "\n  deny mount,\n"

// Text is the profile's text with the includes inc.
func (v Variant) Text(inc Includes) []byte {
	var rules strings.Builder
	rules.WriteString("\n  # oac: instead of the engine's \"deny mount,\", the workload launcher's mounts.\n")
	for _, r := range v.Rules {
		if r.Why != "" {
			rules.WriteString("  # " + r.Why + "\n")
		}
		rules.WriteString("  " + r.String() + "\n")
	}
	base := engineProfile(v.Name, "unconfined", inc)
	if strings.Count(base, denyMount) != 1 {
		panic("apparmor: the engine's template has no single deny mount rule")
	}
	return []byte(v.header() + strings.Replace(base, denyMount, rules.String(), 1))
}

// engineProfile renders the engine's default template as the engine
// does for a profile named name, the engine itself running under the
// profile daemon.
func engineProfile(name, daemon string, inc Includes) string {
	data := struct {
		Name, DaemonProfile   string
		Imports, InnerImports []string
	}{Name: name, DaemonProfile: daemon}
	if inc.Tunables {
		data.Imports = append(data.Imports, "#include <tunables/global>")
	} else {
		data.Imports = append(data.Imports, "@{PROC}=/proc/")
	}
	if inc.Base {
		data.InnerImports = append(data.InnerImports, "#include <abstractions/base>")
	}
	var b bytes.Buffer
	if err := template.Must(template.New(name).Parse(engineDefault)).Execute(&b, data); err != nil {
		panic("apparmor: the engine's template: " + err.Error())
	}
	return b.String()
}
