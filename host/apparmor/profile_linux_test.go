package apparmor

import (
	"os"
	"path/filepath"
	"testing"

	engine "github.com/moby/profiles/apparmor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// enginesOwn has the engine's library generate its default profile for
// name and returns the text it hands to apparmor_parser: a parser on PATH
// that copies its input instead of loading it.
func enginesOwn(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "generated")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "apparmor_parser"), []byte("#!/bin/sh\n# -Kr FILE\ncp \"$2\" "+out+"\n"), 0o755))
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	t.Setenv("TMPDIR", dir)
	require.NoError(t, engine.InstallDefault(name))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	return string(b)
}

func TestTheBaseIsTheEnginesDefaultProfile(t *testing.T) {
	// The library names the engine's own profile as its peer: this
	// process's, "unconfined" where AppArmor does not confine it.
	b, _ := os.ReadFile("/proc/self/attr/current")
	if len(b) > 0 && string(b) != "unconfined\n" {
		t.Skipf("the test runs confined (%q): the library would name that profile", b)
	}
	for _, name := range []string{Name, "docker-default"} {
		assert.Equal(t, enginesOwn(t, name), engineProfile(name, "unconfined", HostIncludes()),
			"engine.go's template is moby's, byte for byte (with this host's includes)")
	}
}

func TestTheProfileIsTheEnginesDefaultWithoutDenyMountPlusTheLaunchersMounts(t *testing.T) {
	b, _ := os.ReadFile("/proc/self/attr/current")
	if len(b) > 0 && string(b) != "unconfined\n" {
		t.Skipf("the test runs confined (%q)", b)
	}
	for _, v := range Variants {
		t.Run(v.Name, func(t *testing.T) { engineDefaultPlusRules(t, v) })
	}
}

func engineDefaultPlusRules(t *testing.T, v Variant) {
	want := lines(enginesOwn(t, v.Name))
	got := lines(string(v.Text(HostIncludes())))
	var removed, added []string
	// A line diff, in order: what the engine's has that ours lacks, and
	// what ours adds.
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case i < len(want) && j < len(got) && want[i] == got[j]:
			i, j = i+1, j+1
		case j < len(got) && (i >= len(want) || !contains(want[i:], got[j])):
			added = append(added, got[j])
			j++
		default:
			removed = append(removed, want[i])
			i++
		}
	}
	assert.Equal(t, []string{"deny mount,"}, removed, "only the engine's deny mount goes")
	var rules []string
	for _, l := range added {
		if l != "" && l[0] != '#' {
			rules = append(rules, l)
		}
	}
	var wantRules []string
	for _, r := range v.Rules {
		wantRules = append(wantRules, r.String())
	}
	assert.Equal(t, wantRules, rules, "and only the launcher's mount rules come, beside comments")
}
