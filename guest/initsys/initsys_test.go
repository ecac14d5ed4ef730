//go:build linux

package initsys

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mountinfo = `22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
23 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=4k
40 23 0:30 / /mnt/with\040space rw - tmpfs tmpfs rw
`

func TestMountInfoFindsMountPoints(t *testing.T) {
	for path, want := range map[string]bool{
		"/proc": true, "/dev": true, "/mnt/with space": true,
		"/sys": false, "/dev/pts": false, "/mnt/with": false,
	} {
		got, err := mountInfoHas(strings.NewReader(mountinfo), path)
		require.NoError(t, err)
		assert.Equal(t, want, got, path)
	}
}

func TestUnescapeOctalLeavesBrokenEscapesAlone(t *testing.T) {
	assert.Equal(t, `a\04`, unescapeOctal(`a\04`))
	assert.Equal(t, "a\tb", unescapeOctal(`a\011b`))
	assert.Equal(t, `a\9xyz`, unescapeOctal(`a\9xyz`))
}

func TestReadModuleListKeepsOrderAndRefusesRelativePaths(t *testing.T) {
	got, err := ReadModuleList(strings.NewReader("# load order\n/lib/modules/v/a.ko\n\n/lib/modules/v/b.ko\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"/lib/modules/v/a.ko", "/lib/modules/v/b.ko"}, got)
	for _, bad := range []string{"a.ko\n", "/lib/modules/x.ko.xz\n", "/etc/passwd\n"} {
		_, err := ReadModuleList(strings.NewReader(bad))
		assert.Error(t, err, "%q", bad)
	}
}
