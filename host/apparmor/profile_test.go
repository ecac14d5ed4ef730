package apparmor

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lines are text's lines, trimmed, without the empty ones.
func lines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func contains(ls []string, l string) bool { return slices.Contains(ls, l) }

// published is a profile's file in examples/apparmor.
func published(name string) string { return filepath.Join("..", "..", "examples", "apparmor", name) }

var both = Includes{Tunables: true, Base: true}

func TestThePublishedProfilesAreTheOnesGenerated(t *testing.T) {
	for _, v := range Variants {
		if os.Getenv("OAC_WRITE_EXAMPLES") == "1" {
			require.NoError(t, os.WriteFile(published(v.Name), v.Text(both), 0o644))
		}
		b, err := os.ReadFile(published(v.Name))
		require.NoError(t, err)
		assert.Equal(t, string(v.Text(both)), string(b), "regenerate it: OAC_WRITE_EXAMPLES=1 go test ./host/apparmor -run Published")
	}
	assert.Equal(t, Guest.Text(both), Published(), "what examples/apparmor/oac-guest holds is what the shim loads on such a host")
}

func TestTheProfileSaysItsVersionAndHowToInstallUpgradeAndRemoveIt(t *testing.T) {
	p := string(Published())
	assert.True(t, strings.HasPrefix(p, "# oac-guest, version 1: "))
	assert.Contains(t, p, "#   install -m 0644 oac-guest /etc/apparmor.d/oac-guest\n#   apparmor_parser -r /etc/apparmor.d/oac-guest\n")
	assert.Contains(t, p, "#   apparmor_parser -R /etc/apparmor.d/oac-guest && rm /etc/apparmor.d/oac-guest\n")
	assert.Contains(t, p, "\n#include <tunables/global>\n")
	assert.Contains(t, p, "\n  #include <abstractions/base>\n")
	assert.Contains(t, p, "\nprofile oac-guest flags=(attach_disconnected,mediate_deleted) {\n")
	assert.Contains(t, p, "  signal (send,receive) peer=oac-guest,\n", "the engine's rules, named for this profile")

	h := string(Helper.Text(both))
	assert.True(t, strings.HasPrefix(h, "# oac-guest-helper, version 1: "))
	assert.Contains(t, h, "\nprofile oac-guest-helper flags=(attach_disconnected,mediate_deleted) {\n")
	assert.Contains(t, h, "#   apparmor_parser -r /etc/apparmor.d/oac-guest-helper\n")
}

func TestTheHelpersProfileIsTheGuestsPlusTheHelpersOwnMounts(t *testing.T) {
	assert.Equal(t, append(append([]MountRule(nil), MountRules...), HelperMountRules...), Helper.Rules)
	assert.Equal(t, MountRules, Guest.Rules, "oac-guest has none of the helper's")
}

func TestAHostWithoutIncludesGetsTheEnginesFallback(t *testing.T) {
	p := string(Profile(Includes{}))
	assert.NotContains(t, p, "#include")
	assert.Contains(t, p, "\n@{PROC}=/proc/\n")
}

// mountLine is a mount rule as AppArmor reads it.
var mountLine = regexp.MustCompile(`^(deny |audit )?(mount|remount|umount|pivot_root)\b`)

func TestEveryMountRuleNamesItsOptionsAndTarget(t *testing.T) {
	for _, v := range Variants {
		t.Run(v.Name, func(t *testing.T) { everyMountRuleNamesItsOptionsAndTarget(t, v) })
	}
}

func everyMountRuleNamesItsOptionsAndTarget(t *testing.T, v Variant) {
	var mounts []string
	for _, l := range lines(string(v.Text(both))) {
		if !mountLine.MatchString(l) {
			continue
		}
		mounts = append(mounts, l)
		if l == "umount," {
			continue // the engine's own: detaching is not mounting
		}
		assert.Regexp(t, `^mount (fstype=[a-z]+ )?options=\([a-z,]+\) (\S+ )?-> /\S*,$`, l, "no bare or partial mount rule")
	}
	assert.Len(t, mounts, len(v.Rules)+1, "the launcher's rules and the engine's umount, no pivot_root, no other")
	assert.NotContains(t, mounts, "deny mount,")
	assert.NotContains(t, mounts, "mount,")
}

func TestTheRulesNameOnlyTheLaunchersTargets(t *testing.T) {
	targets := map[string]bool{}
	for _, r := range MountRules {
		targets[r.Target] = true
		assert.NotContains(t, r.Target, "*", "no globbing: %s", r)
		assert.NotContains(t, r.Source, "*", "no globbing: %s", r)
		assert.NotEmpty(t, r.Options, "%s", r)
	}
	var got []string
	for tg := range targets {
		got = append(got, tg)
	}
	slices.Sort(got)
	assert.Equal(t, []string{"/", "/dev/", "/dev/full", "/dev/mqueue/", "/dev/null", "/dev/pts/", "/dev/random", "/dev/shm/",
		"/dev/tty", "/dev/urandom", "/dev/zero", "/home/runtime/sandbox-io-bootstrap.json"}, got)
}
