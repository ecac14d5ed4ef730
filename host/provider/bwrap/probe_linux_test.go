package bwrap

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shipped profile and the path check names are one: a profile that
// attached elsewhere would leave the app's bwrap restricted.
func TestTheShippedProfileAttachesToTheAppsOwnBwrapWithUserns(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("../../../examples/apparmor/oac-bwrap")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, OwnBwrapProfile), b, 0o644))
	file, userns := attachedProfile(dir, OwnBwrap)
	assert.Equal(t, OwnBwrapProfile, file)
	assert.True(t, userns)
	var rules []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			rules = append(rules, l)
		}
	}
	// Ubuntu's recommended form, nothing else: no transition, no deny,
	// so bwrap's children keep their capabilities in their namespaces.
	assert.Equal(t, []string{
		"abi <abi/4.0>,",
		"include <tunables/global>",
		"profile oac-bwrap /opt/oac/bin/bwrap flags=(unconfined) {",
		"userns,",
		"include if exists <local/oac-bwrap>",
		"}",
	}, rules)
	assert.Contains(t, string(b), "# oac-bwrap, version 1:")
}

// bwrap-userns-restrict's text as Debian 13 ships it
// (/usr/share/apparmor/extra-profiles, upstream AppArmor 4.1, GPL-2.0):
// the header lines that matter here.
const restrictHeaders = `abi <abi/4.0>,
include <tunables/global>
# a comment naming /opt/oac/bin/bwrap attaches nothing
profile bwrap /usr/bin/bwrap flags=(attach_disconnected,mediate_deleted) {
  allow userns,
  allow pix /** -> &bwrap//&unpriv_bwrap,
}
profile unpriv_bwrap flags=(attach_disconnected,mediate_deleted) {
  allow userns,
  audit deny capability,
}
`

func TestAttachedProfileMatchesTheResolvedPathNotAMention(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bwrap-userns-restrict"), []byte(restrictHeaders), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old-style"), []byte("/usr/local/bin/bwrap {\n  userns,\n}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "no-userns"), []byte("profile x /srv/bwrap {\n}\n"), 0o644))

	file, userns := attachedProfile(dir, "/usr/bin/bwrap")
	assert.Equal(t, "bwrap-userns-restrict", file)
	assert.True(t, userns)
	file, _ = attachedProfile(dir, OwnBwrap)
	assert.Empty(t, file, "Ubuntu's profile only mentions the app's bwrap in a comment")
	file, userns = attachedProfile(dir, "/usr/local/bin/bwrap")
	assert.Equal(t, "old-style", file)
	assert.True(t, userns)
	file, userns = attachedProfile(dir, "/srv/bwrap")
	assert.Equal(t, "no-userns", file)
	assert.False(t, userns)

	// The kernel attaches by the path it executes: a symlink's target.
	link := filepath.Join(t.TempDir(), "bwrap")
	require.NoError(t, os.Symlink("/usr/bin/bwrap", link))
	if r, err := filepath.EvalSymlinks(link); err == nil && r == "/usr/bin/bwrap" {
		file, _ = attachedProfile(dir, link)
		assert.Equal(t, "bwrap-userns-restrict", file)
	}
}

func TestProbeArgsRunThisBinaryAsPID1WithEveryCapabilityInItsOwnUserNamespace(t *testing.T) {
	a := strings.Join(probeArgs("/opt/oac/bin/oac-shim", nil), " ")
	assert.Contains(t, a, "--unshare-user --unshare-pid")
	assert.Contains(t, a, "--as-pid-1")
	assert.Contains(t, a, "--uid 0 --gid 0 --cap-add ALL")
	assert.Contains(t, a, "--tmpfs /tmp")
	assert.True(t, strings.HasSuffix(a, "--ro-bind /opt/oac/bin/oac-shim "+probePath+" --setenv "+probeEnv+" 1 -- "+probePath), a)
}

func needRootAnd(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " is not installed")
		}
	}
}

// Without AppArmor (this build machine) the real bwrap runs the probe and
// its child mounts in its own namespace: nothing is refused.
func TestTheProbeRunsUnderTheRealBwrapAndItsChildMayMount(t *testing.T) {
	needRootAnd(t, "bwrap")
	bw, _ := exec.LookPath("bwrap")
	r := runProbe(bw)
	require.True(t, r.Ran, "%+v", r)
	assert.Empty(t, r.Denied)
	assert.Empty(t, r.Err)
}

// A child the kernel refuses capabilities (here: no capabilities at all,
// as unpriv_bwrap's "audit deny capability" leaves it) is reported as
// refused, with the kernel's error.
func TestTheProbeReportsAChildRefusedItsMount(t *testing.T) {
	needRootAnd(t, "unshare", "setpriv")
	exe, err := os.Executable()
	require.NoError(t, err)
	// A stand-in for a confined bwrap: the child is PID 1 of its own pid
	// namespace with a /tmp of its own (over the test binary's directory:
	// it runs from a descriptor), and has no capabilities left.
	fake := filepath.Join(t.TempDir(), "bwrap")
	require.NoError(t, os.WriteFile(fake, []byte(`#!/bin/sh
exec 9<`+exe+`
exec unshare --pid --fork --mount --mount-proc sh -c 'mount -t tmpfs none /tmp && exec setpriv --reuid 65534 --regid 65534 --clear-groups --inh-caps=-all --bounding-set=-all env `+probeEnv+`=1 /proc/self/fd/9'
`), 0o755))
	r := runProbe(fake)
	require.True(t, r.Ran, "%+v", r)
	assert.Contains(t, r.Denied, "mount: operation not permitted")
}

func TestABwrapThatCannotStartTheProbeIsSaidSo(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "bwrap")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"), 0o755))
	r := runProbe(fake)
	assert.False(t, r.Ran)
	assert.Equal(t, fake+" did not run the capability probe: bwrap: setting up uid map: Permission denied", r.Err)
}
