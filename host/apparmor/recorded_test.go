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

// recorded is one operation the kernel logged.
type recorded struct {
	op, profile, fstype, src, target string
	flags                            []string
	line                             string
}

var auditField = regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`)

// recording reads the AppArmor lines of a kernel log (testdata).
func recording(t *testing.T, file string) []recorded {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	require.NoError(t, err)
	var out []recorded
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "apparmor=") {
			continue
		}
		f := map[string]string{}
		for _, m := range auditField.FindAllStringSubmatch(l, -1) {
			f[m[1]] = strings.Trim(m[2], `"`)
		}
		require.Equal(t, "ALLOWED", f["apparmor"], "complain mode logs what it would refuse: %s", l)
		r := recorded{op: f["operation"], profile: f["profile"], fstype: f["fstype"], src: f["srcname"], target: f["name"], line: l}
		if f["flags"] != "" {
			r.flags = strings.Split(f["flags"], ", ")
			slices.Sort(r.flags)
		}
		out = append(out, r)
	}
	require.NotEmpty(t, out, "%s holds no AppArmor line", file)
	return out
}

// matches reports whether the rule allows the recorded mount exactly:
// AppArmor's options=(...) is the flags, every one and no other.
func (r MountRule) matches(m recorded) bool {
	opts := slices.Clone(r.Options)
	slices.Sort(opts)
	return m.op == "mount" && r.FSType == m.fstype && r.Source == m.src && r.Target == m.target && slices.Equal(opts, m.flags)
}

func TestTheRulesAreTheRecordedMounts(t *testing.T) {
	for _, tc := range []struct {
		file string
		v    Variant
	}{
		{"launcher-mounts.log", Guest},
		{"helper-mounts.log", Helper},
	} {
		t.Run(tc.v.Name, func(t *testing.T) {
			rec := recording(t, tc.file)
			used := map[int]bool{}
			for _, m := range rec {
				assert.Equal(t, tc.v.Name, m.profile, m.line)
				switch m.op {
				case "mount":
					i := slices.IndexFunc(tc.v.Rules, func(r MountRule) bool { return r.matches(m) })
					if assert.GreaterOrEqual(t, i, 0, "a recorded mount no rule allows: %s", m.line) {
						used[i] = true
					}
				case "umount":
					// Detaching the masks' tmpfs: the engine default's
					// own `umount,` allows it, no rule is added for it.
					assert.Equal(t, "/dev/", m.target, m.line)
					assert.Contains(t, lines(string(tc.v.Text(both))), "umount,")
				default:
					t.Errorf("the launcher was recorded making %s, which no rule allows: %s", m.op, m.line)
				}
			}
			for i, r := range tc.v.Rules {
				assert.True(t, used[i], "a rule the launcher was never recorded needing: %s", r)
			}
		})
	}
}

func TestTheHelpersOwnRulesAreOnlyInItsProfile(t *testing.T) {
	for _, m := range recording(t, "launcher-mounts.log") {
		for _, r := range HelperMountRules {
			assert.False(t, r.matches(m), "the docker provider's guest was recorded making a helper mount: %s", m.line)
		}
	}
}
