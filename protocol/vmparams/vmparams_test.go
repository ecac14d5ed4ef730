package vmparams

import (
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSharesRoundTrip(t *testing.T) {
	in := []Share{{Tag: "workspace", Path: "/environment/workspace"}, {Tag: "home", Path: "/home", ReadOnly: true}}
	v, err := FormatShares(in)
	require.NoError(t, err)
	assert.Equal(t, "workspace:/environment/workspace,home:/home:ro", v)
	out, err := ParseShares(v)
	require.NoError(t, err)
	assert.Equal(t, in, out)
	out, err = ParseShares("")
	require.NoError(t, err)
	assert.Empty(t, out)
}

func TestParseSharesRefusesWhatCouldNameTheWrongPlace(t *testing.T) {
	for _, bad := range []string{
		"workspace", "workspace:", ":/x", "w:relative", "w:/a/../b", "w:/a/./b", "w:/a/", "w:/", "w://a",
		"w:/proc", "w:/sys/kernel", "w:/dev/x", "w:/a b", "w:/a:rw", "w:/a:ro:x", "a/b:/x", strings.Repeat("t", 37) + ":/x",
		"a:/x,b:/x", "w:/" + strings.Repeat("a", 256), strings.Repeat("t:/x,", MaxShares) + "t:/y",
	} {
		_, err := ParseShares(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err := FormatShares([]Share{{Tag: "x", Path: "/proc/self"}})
	assert.Error(t, err, "the host never writes what the guest would refuse")
}

func TestParseRoot(t *testing.T) {
	r, err := ParseRoot("vda")
	require.NoError(t, err)
	assert.Equal(t, "vda", r)
	for _, bad := range []string{"", "/dev/vda", "../vda", "VDA", "vda1/x"} {
		_, err := ParseRoot(bad)
		assert.Error(t, err, bad)
		_, err = ParseKeep(bad)
		assert.Error(t, err, bad)
	}
	k, err := ParseKeep(KeepDevice(true))
	require.NoError(t, err)
	assert.Equal(t, "vdb", k)
	assert.Equal(t, RootDevice, KeepDevice(false), "without a root disk the kept disk is the first")
}

// FuzzParseShares: the kernel command line is input the guest did not
// write; what parses names only clean absolute paths outside the kernel's
// filesystems, and formats back to itself.
func FuzzParseShares(f *testing.F) {
	f.Add("workspace:/environment/workspace,home:/home:ro")
	f.Add("a:/b:ro,c:/d")
	f.Add("w:/proc/../x")
	f.Fuzz(func(t *testing.T, v string) {
		shares, err := ParseShares(v)
		if err != nil {
			return
		}
		for _, s := range shares {
			if path.Clean(s.Path) != s.Path || s.Path == "/" || !path.IsAbs(s.Path) {
				t.Fatalf("unclean path accepted: %q", s.Path)
			}
			for _, sys := range []string{"/proc", "/sys", "/dev"} {
				if s.Path == sys || strings.HasPrefix(s.Path, sys+"/") {
					t.Fatalf("a path below %s accepted: %q", sys, s.Path)
				}
			}
		}
		again, err := FormatShares(shares)
		if err != nil || again != v {
			t.Fatalf("%q formats back as %q (%v)", v, again, err)
		}
	})
}
