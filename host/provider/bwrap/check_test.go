package bwrap

import (
	"strings"
	"testing"

	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSubIDsMatchesNameOrUIDAndSkipsMalformedLines(t *testing.T) {
	in := `# comment
alice:100000:65536
bob:165536:65536
1001:300000:5000
alice:bad:1
alice:1:0
alice:400000:1000
carol:1:2:3
`
	rs, err := ParseSubIDs(strings.NewReader(in), "alice", 1001)
	require.NoError(t, err)
	assert.Equal(t, []IDRangeEntry{{100000, 65536}, {300000, 5000}, {400000, 1000}}, rs)
	rs, err = ParseSubIDs(strings.NewReader(in), "dave", 4242)
	require.NoError(t, err)
	assert.Empty(t, rs)
}

func TestPickRangePrefersAFullRangeAndNeedsAtLeast1000IDs(t *testing.T) {
	r, ok := pickRange([]IDRangeEntry{{10, 2000}, {100000, 70000}})
	assert.True(t, ok)
	assert.Equal(t, IDRangeEntry{100000, kit.IDRange - 1}, r, "guest ids 1..65535")
	r, ok = pickRange([]IDRangeEntry{{10, 2000}, {5000, 1500}})
	assert.True(t, ok)
	assert.Equal(t, IDRangeEntry{10, 2000}, r)
	_, ok = pickRange([]IDRangeEntry{{10, 999}})
	assert.False(t, ok, "guest uid 1000 would not be mapped")
}

func rootlessFacts() Facts {
	return Facts{
		BwrapPath: "/usr/bin/bwrap", User: "alice", UID: 1001, GID: 1001,
		UnprivUsernsClone: -1, MaxUserNamespaces: 1000, AppArmorRestrict: -1,
		SubUIDs: []IDRangeEntry{{100000, 65536}}, SubGIDs: []IDRangeEntry{{100000, 65536}},
		NewUIDMap: "/usr/bin/newuidmap", NewGIDMap: "/usr/bin/newgidmap",
	}
}

func TestDiagnoseVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(*Facts)
		mode     Mode
		problems []string // substrings, one per expected problem
	}{
		{"root", func(f *Facts) { f.Root = true; f.SubUIDs = nil; f.NewUIDMap = "" }, ModeRoot, nil},
		{"root without bwrap", func(f *Facts) { f.Root = true; f.BwrapPath = "" }, ModeRoot, []string{"apt-get install bubblewrap"}},
		{"rootless with subordinate ids", func(f *Facts) {}, ModeSubIDs, nil},
		{"user namespaces disabled", func(f *Facts) { f.MaxUserNamespaces = 0 }, ModeSubIDs, []string{"user.max_user_namespaces=0"}},
		{"unprivileged clone disabled", func(f *Facts) { f.UnprivUsernsClone = 0 }, ModeSubIDs, []string{"kernel.unprivileged_userns_clone=1"}},
		{"unprivileged clone enabled", func(f *Facts) { f.UnprivUsernsClone = 1 }, ModeSubIDs, nil},
		{"apparmor restricts, no profile", func(f *Facts) { f.AppArmorRestrict = 1 }, ModeSubIDs, []string{"no AppArmor profile lets /usr/bin/bwrap create one"}},
		{"apparmor restricts, profile allows", func(f *Facts) { f.AppArmorRestrict = 1; f.BwrapProfileUserns = true }, ModeSubIDs, nil},
		{"apparmor restricts, profile not loaded", func(f *Facts) {
			f.AppArmorRestrict, f.BwrapProfileUserns, f.BwrapProfile = 1, true, "oac-bwrap"
			f.ProbeErr = "/usr/bin/bwrap did not run the capability probe: bwrap: setting up uid map: Permission denied"
		}, ModeSubIDs, []string{"sudo apparmor_parser -r /etc/apparmor.d/oac-bwrap"}},
		{"a probe quirk blocks nothing without the restriction", func(f *Facts) { f.ProbeErr = "bwrap: something" }, ModeSubIDs, nil},
		{"bwrap's children without capabilities", func(f *Facts) {
			f.BwrapProfile, f.BwrapProfileUserns = "bwrap-userns-restrict", true
			f.ChildLabel, f.ChildCapsDenied = "bwrap//&unpriv_bwrap (enforce)", "mount: permission denied"
		}, ModeSubIDs, []string{"AppArmor runs bwrap's children without capabilities"}},
		{"bwrap's children without capabilities, as root", func(f *Facts) {
			f.Root = true
			f.ChildLabel, f.ChildCapsDenied = "bwrap//&unpriv_bwrap (enforce)", "mount: permission denied"
		}, ModeRoot, []string{"AppArmor runs bwrap's children without capabilities"}},
		{"bwrap's children without capabilities, restriction on", func(f *Facts) {
			f.AppArmorRestrict, f.BwrapProfile, f.BwrapProfileUserns = 1, "bwrap-userns-restrict", true
			f.ChildLabel, f.ChildCapsDenied = "bwrap//&unpriv_bwrap (enforce)", "mount: permission denied"
		}, ModeSubIDs, []string{"/etc/apparmor.d/bwrap-userns-restrict confines /usr/bin/bwrap"}},
		{"the app's own bwrap under its profile", func(f *Facts) {
			f.AppArmorRestrict, f.BwrapPath, f.BwrapProfile, f.BwrapProfileUserns = 1, OwnBwrap, "oac-bwrap", true
			f.ChildLabel = "oac-bwrap (unconfined)"
		}, ModeSubIDs, nil},
		{"no helpers", func(f *Facts) { f.NewUIDMap = "" }, ModeSubIDs, []string{"apt-get install uidmap"}},
		{"no subordinate ids", func(f *Facts) { f.SubUIDs = nil }, ModeSubIDs, []string{"usermod --add-subuids"}},
		{"no subordinate gids", func(f *Facts) { f.SubGIDs = []IDRangeEntry{{5, 10}} }, ModeSubIDs, []string{"no subordinate id range"}},
		{"nothing, single uid asked", func(f *Facts) { f.SubUIDs = nil; f.NewUIDMap = ""; f.SingleUIDAllowed = true }, ModeSingleUID, nil},
		{"subordinate ids win over single uid", func(f *Facts) { f.SingleUIDAllowed = true }, ModeSubIDs, nil},
		{"several causes at once", func(f *Facts) { f.BwrapPath = ""; f.SubUIDs = nil; f.NewGIDMap = "" }, ModeSubIDs,
			[]string{"apt-get install bubblewrap", "apt-get install uidmap", "usermod --add-subuids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := rootlessFacts()
			tc.edit(&f)
			mode, ps := Diagnose(f)
			assert.Equal(t, tc.mode, mode)
			require.Len(t, ps, len(tc.problems), "%v", ps)
			for i, want := range tc.problems {
				assert.Contains(t, ps[i].String(), want)
			}
		})
	}
}

func TestRootlessArgsLetBwrapBlockUntilTheHelpersMapIDs(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, Mode: ModeSubIDs, InfoFD: 5, BlockFD: 6}), " ")
	assert.Contains(t, a, "--unshare-user --userns-block-fd 6 --info-fd 5 --uid 0 --gid 0 --cap-add ALL")
	assert.NotContains(t, a, "--disable-userns")
	a = strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, Mode: ModeSingleUID, Hostname: "h"}), " ")
	assert.Contains(t, a, "--unshare-user --uid 1000 --gid 1000 --cap-add CAP_SYS_ADMIN --cap-add CAP_SETPCAP --hostname h",
		"the agent may give workload processes mount namespaces of their own")
	a = strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, Mode: ModeSingleUID, DisableUserns: true}), " ")
	assert.Contains(t, a, "--cap-add CAP_SETPCAP --disable-userns")
	a = strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4, Mode: ModeSubIDs, DisableUserns: true}), " ")
	assert.NotContains(t, a, "--disable-userns", "it would map one id: guest root and uid 1000 need two")
}

// Ubuntu's bwrap-userns-restrict takes the capabilities the guest agent
// needs (seen in a VM enforcing it: chown, net_bind_service and sys_admin
// refused to the agent): check must never recommend it, and must say
// exactly what to install instead.
func TestCheckRecommendsTheAppsOwnBwrapProfileNeverBwrapUsernsRestrict(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Facts)
	}{
		{"restriction on, no profile", func(f *Facts) { f.AppArmorRestrict = 1 }},
		{"children without capabilities", func(f *Facts) {
			f.BwrapProfile, f.ChildLabel, f.ChildCapsDenied = "bwrap-userns-restrict", "bwrap//&unpriv_bwrap (enforce)", "mount: permission denied"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := rootlessFacts()
			tc.edit(&f)
			_, ps := Diagnose(f)
			require.Len(t, ps, 1)
			fix := ps[0].Fix
			assert.NotContains(t, fix, "install the bwrap-userns-restrict")
			assert.Contains(t, fix, "not Ubuntu's bwrap-userns-restrict")
			assert.Contains(t, fix, "sudo install -D -m 0755 /usr/bin/bwrap /opt/oac/bin/bwrap")
			assert.Contains(t, fix, "sudo install -m 0644 examples/apparmor/oac-bwrap /etc/apparmor.d/oac-bwrap && sudo apparmor_parser -r /etc/apparmor.d/oac-bwrap")
			assert.Contains(t, fix, "oac-shim takes that bwrap before any in PATH")
			assert.Contains(t, fix, "docs/ubuntu.md")
		})
	}
}

func TestCheckAsksOnlyForTheProfileWhenBwrapIsAlreadyTheAppsOwn(t *testing.T) {
	f := rootlessFacts()
	f.BwrapPath, f.AppArmorRestrict = OwnBwrap, 1
	_, ps := Diagnose(f)
	require.Len(t, ps, 1)
	assert.NotContains(t, ps[0].Fix, "sudo install -D -m 0755")
	assert.NotContains(t, ps[0].Fix, "before any in PATH")
	assert.Contains(t, ps[0].Fix, "sudo apparmor_parser -r /etc/apparmor.d/oac-bwrap")
}
