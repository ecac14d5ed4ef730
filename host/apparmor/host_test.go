package apparmor

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeFS is an AppArmor securityfs listing profiles.
func fakeFS(t *testing.T, profiles ...string) string {
	t.Helper()
	dir := t.TempDir()
	var s string
	for _, p := range profiles {
		s += p + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "profiles"), []byte(s), 0o644))
	return dir
}

func TestParseModeTakesLoadOrRequire(t *testing.T) {
	for in, want := range map[string]Mode{"": Load, "load": Load, "require": Require} {
		m, err := ParseMode("--x", in)
		require.NoError(t, err)
		assert.Equal(t, want, m)
	}
	for _, in := range []string{"unconfined", "off", "Load"} {
		_, err := ParseMode("--x", in)
		assert.EqualError(t, err, `--x "`+in+`": want load or require`)
	}
}

func TestLoadedReadsTheKernelsList(t *testing.T) {
	h := Host{FS: fakeFS(t, "docker-default (enforce)", "oac-guest-old (complain)", "/usr/bin/man (enforce)", "oac-guest (enforce)")}
	ok, err := h.Loaded(Name)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = Host{FS: fakeFS(t, "docker-default (enforce)", "oac-guest-old (enforce)")}.Loaded(Name)
	require.NoError(t, err)
	assert.False(t, ok, "another profile's name is not a match")

	_, err = Host{FS: t.TempDir()}.Loaded(Name)
	assert.ErrorContains(t, err, "is securityfs mounted, AppArmor enabled in this kernel?")
}

func TestThePolicyDirectoryNamesTheProfilesForOthersThanRoot(t *testing.T) {
	fs := t.TempDir()
	for dir, name := range map[string]string{"docker-default.3": "docker-default", "oac-guest.12": "oac-guest", "oac-guest-old.4": "oac-guest-old"} {
		p := filepath.Join(fs, "policy", "profiles", dir)
		require.NoError(t, os.MkdirAll(p, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(p, "name"), []byte(name+"\n"), 0o444))
	}
	ok, err := Host{FS: fs}.inPolicyDir(Name)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = Host{FS: fs}.inPolicyDir("oac")
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestDecide(t *testing.T) {
	parser := filepath.Join(t.TempDir(), "apparmor_parser")
	require.NoError(t, os.WriteFile(parser, []byte("#!/bin/sh\n"), 0o755))
	root := func() bool { return true }
	user := func() bool { return false }
	without, with := fakeFS(t, "docker-default (enforce)"), fakeFS(t, "docker-default (enforce)", "oac-guest (enforce)")
	for _, tc := range []struct {
		name     string
		h        Host
		mode     Mode
		confines bool
		want     Plan
		err      string
	}{
		{"no AppArmor: nothing asked for", Host{FS: without, Parser: parser, Root: root}, Require, false, Plan{}, ""},
		{"load as root", Host{FS: without, Parser: parser, Root: root}, Load, true, Plan{Profile: Name, Load: true}, ""},
		{"load as root, loaded already: loaded again", Host{FS: with, Parser: parser, Root: root}, Load, true, Plan{Profile: Name, Load: true}, ""},
		{"load, not root, loaded", Host{FS: with, Parser: parser, Root: user}, Load, true, Plan{Profile: Name}, ""},
		{"load, not root, missing", Host{FS: without, Parser: parser, Root: user}, Load, true, Plan{},
			"the profile oac-guest is not loaded, and oac-shim cannot load it (oac-shim is not root)"},
		{"load, no parser, missing", Host{FS: without, Parser: "", Root: root}, Load, true, Plan{},
			"oac-shim cannot load it (apparmor_parser is not installed (apt-get install apparmor))"},
		{"require, loaded", Host{FS: with, Parser: parser, Root: root}, Require, true, Plan{Profile: Name}, ""},
		{"require, missing, even as root", Host{FS: without, Parser: parser, Root: root}, Require, true, Plan{},
			"the profile oac-guest is not loaded (--flag require)"},
		{"require, no securityfs", Host{FS: t.TempDir(), Parser: parser, Root: root}, Require, true, Plan{},
			"cannot tell whether the profile oac-guest is loaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.h.Parser == "" {
				t.Setenv("PATH", t.TempDir())
				if _, err := os.Stat("/usr/sbin/apparmor_parser"); err == nil {
					t.Skip("this host has apparmor_parser in /usr/sbin")
				}
			}
			p, err := tc.h.Decide(tc.mode, tc.confines, "--flag", "the engine")
			if tc.err != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrProfileMissing)
				assert.Contains(t, err.Error(), tc.err)
				assert.Contains(t, err.Error(), "the engine confines containers with AppArmor")
				assert.Contains(t, err.Error(), "install examples/apparmor/oac-guest as root: install -m 0644 oac-guest /etc/apparmor.d/oac-guest && apparmor_parser -r /etc/apparmor.d/oac-guest")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want.Profile, p.Profile)
			assert.Equal(t, tc.want.Load, p.Load)
			assert.NotEmpty(t, p.How)
			assert.NotEqual(t, "unconfined", p.Profile)
		})
	}
}

func TestLoadHandsTheParserTheTextAndChecksTheKernelListsIt(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("a shell script stands in for the parser")
	}
	dir := t.TempDir()
	fs := fakeFS(t, "docker-default (enforce)")
	parser := filepath.Join(dir, "apparmor_parser")
	require.NoError(t, os.WriteFile(parser, []byte("#!/bin/sh\necho \"$*\" > "+dir+"/args\ncat > "+dir+"/in\necho 'oac-guest (enforce)' >> "+fs+"/profiles\n"), 0o755))
	h := Host{FS: fs, Parser: parser}
	require.NoError(t, h.Load(context.Background(), []byte("profile text")))
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	in, _ := os.ReadFile(filepath.Join(dir, "in"))
	assert.Equal(t, "-Kr\n", string(args))
	assert.Equal(t, "profile text", string(in))

	require.NoError(t, os.WriteFile(parser, []byte("#!/bin/sh\necho 'apparmor_parser: Unable to replace \"oac-guest\".  Permission denied; attempted to load a profile while confined?' >&2\nexit 243\n"), 0o755))
	err := h.Validate(context.Background(), []byte("x"))
	assert.ErrorContains(t, err, parser+" -QK: apparmor_parser: Unable to replace \"oac-guest\". Permission denied; attempted to load a profile while confined?")
}
