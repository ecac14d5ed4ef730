package ospolicy

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMacOSPolicy(t *testing.T) {
	tests := []struct {
		version string
		level   Level
	}{
		{"10.15.7", Block},
		{"11.7.10", Block},
		{"11.0", Block},
		{"12.0", OK},
		{"12.7.1", OK},
		{"13.6", OK},
		{"14.2.1", OK},
		{"15.0", OK},
		{"26.0", OK},
		{"", Warn},
		{"garbage", Warn},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			v := Evaluate(OS{GOOS: "darwin", Version: tt.version})
			assert.Equal(t, tt.level, v.Level)
			assert.NotEmpty(t, v.Message)
		})
	}
}

func TestMacOSBlockSaysWhy(t *testing.T) {
	v := Evaluate(OS{GOOS: "darwin", Version: "11.7.10"})
	assert.Equal(t, Block, v.Level)
	assert.Contains(t, v.Message, "macOS 11.7.10 is not supported")
	assert.Contains(t, v.Message, "macOS 12 (Monterey) or newer")
	assert.Contains(t, v.Message, "Virtualization.framework")
	assert.Contains(t, v.Message, "virtio-fs")
	assert.Contains(t, v.Message, "Update macOS")
}

func TestWindowsPolicyNeverBlocks(t *testing.T) {
	tests := []struct {
		name   string
		build  int
		level  Level
		phrase string
	}{
		{"Windows 11 24H2", 26100, OK, "Windows 11"},
		{"Windows 11 23H2", 22631, OK, "Windows 11"},
		{"Windows 11 21H2", 22000, OK, "Windows 11"},
		{"Windows Server 2022", 20348, Warn, "Windows 10 22H2"},
		{"Windows 10 22H2", 19045, Warn, "Windows 10 22H2"},
		{"Windows 10 21H2", 19044, Warn, "older than Windows 10 22H2"},
		{"Windows 10 1909", 18363, Warn, "older than Windows 10 22H2"},
		{"Windows 10 1507", 10240, Warn, "older than Windows 10 22H2"},
		{"unknown build", 0, Warn, "could not read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Evaluate(OS{GOOS: "windows", Version: "10.0", Build: tt.build})
			assert.Equal(t, tt.level, v.Level)
			assert.NotEqual(t, Block, v.Level, "Windows is warn-never-block")
			assert.Contains(t, v.Message, tt.phrase)
		})
	}
}

func TestOlderWindowsGetsAStrongerWarning(t *testing.T) {
	w22h2 := Evaluate(OS{GOOS: "windows", Build: 19045})
	older := Evaluate(OS{GOOS: "windows", Build: 19044})
	assert.NotContains(t, w22h2.Message, "no longer receives security updates")
	assert.Contains(t, older.Message, "no longer receives security updates")
	assert.Contains(t, older.Message, "may be missing or broken")
}

func TestLinuxIsOKAndOthersWarn(t *testing.T) {
	assert.Equal(t, OK, Evaluate(OS{GOOS: "linux", Version: "6.1.0"}).Level)
	v := Evaluate(OS{GOOS: "freebsd"})
	assert.Equal(t, Warn, v.Level)
	assert.Contains(t, v.Message, "freebsd")
}

func TestDetectDescribesThisOS(t *testing.T) {
	o := Detect()
	assert.Equal(t, runtime.GOOS, o.GOOS)
	assert.NotEmpty(t, o.Name)
	if runtime.GOOS == "linux" {
		assert.NotEmpty(t, o.Version, "the kernel release")
		assert.Equal(t, OK, Evaluate(o).Level)
	}
}
