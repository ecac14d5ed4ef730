package wsl

import (
	"errors"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"

	"github.com/oac/sandbox-agent/host/provider"
)

func utf16LE(s string, bom bool) []byte {
	var b []byte
	if bom {
		b = append(b, 0xFF, 0xFE)
	}
	for _, c := range utf16.Encode([]rune(s)) {
		b = append(b, byte(c), byte(c>>8))
	}
	return b
}

func TestCommandLines(t *testing.T) {
	assert.Equal(t, "oac-demo", DistroName("demo"))
	assert.Equal(t, []string{"--import", "oac-demo", `C:\oac\demo`, `C:\img\rootfs.tar.gz`, "--version", "2"},
		importArgs("oac-demo", `C:\oac\demo`, `C:\img\rootfs.tar.gz`))
	assert.Equal(t, []string{"-d", "oac-demo", "-u", "root", "--exec", "/sbin/oac-guest", "--transport", "stdio://"}, agentArgs("oac-demo", false, false))
	assert.Equal(t, "--debug", agentArgs("oac-demo", true, false)[8])
	assert.Equal(t, "--kept", agentArgs("oac-demo", false, true)[8], "a kept distribution's agent gives /usr/local to uid 1000")
	assert.Equal(t, []string{"--terminate", "oac-demo"}, terminateArgs("oac-demo"))
	assert.Equal(t, []string{"--unregister", "oac-demo"}, unregisterArgs("oac-demo"))
	assert.Equal(t, []string{"--version"}, versionArgs())
	assert.Equal(t, []string{"--list", "--quiet"}, listArgs())
}

func TestDecodeAcceptsUTF16AndUTF8(t *testing.T) {
	want := "WSL version: 2.1.5.0\nKernel version: 5.15.146.1-2\n"
	for name, in := range map[string][]byte{
		"utf-16le":          utf16LE("WSL version: 2.1.5.0\r\nKernel version: 5.15.146.1-2\r\n", false),
		"utf-16le with bom": utf16LE("WSL version: 2.1.5.0\r\nKernel version: 5.15.146.1-2\r\n", true),
		"utf-8":             []byte("WSL version: 2.1.5.0\r\nKernel version: 5.15.146.1-2\r\n"),
		"utf-8 with bom":    []byte("\uFEFFWSL version: 2.1.5.0\nKernel version: 5.15.146.1-2\n"),
	} {
		t.Run(name, func(t *testing.T) { assert.Equal(t, want, decode(in)) })
	}
	assert.Equal(t, "Ünïcode ✓\n", decode(utf16LE("Ünïcode ✓\r\n", true)))
	assert.Equal(t, "", decode(nil))
}

func TestParseVersion(t *testing.T) {
	tests := map[string]string{
		"WSL version: 2.1.5.0\nKernel version: 5.15.146.1-2\n": "2.1.5.0",
		"WSL-Version: 2.0.9.0\nKernelversion: 5.15.133.1-1\n":  "2.0.9.0", // German
		"Version de WSL : 1.2.5.0\n":                           "1.2.5.0", // French
		"WSL version: 0.70.4\n":                                "0.70.4",
	}
	for out, want := range tests {
		v, ok := parseVersion(out)
		assert.True(t, ok, out)
		assert.Equal(t, want, v)
	}
	for _, out := range []string{"", "Invalid command line option: --version\nUsage: wsl.exe [Argument]\n", "Kernel version: 5.15.1\n"} {
		_, ok := parseVersion(out)
		assert.False(t, ok, out)
	}
}

func TestVersionAtLeast(t *testing.T) {
	assert.True(t, versionAtLeast("2.1.5.0", "1.0.0"))
	assert.True(t, versionAtLeast("1.0.0", "1.0.0"))
	assert.True(t, versionAtLeast("1.0.0.0", "1.0.0"))
	assert.True(t, versionAtLeast("1.10.0", "1.9.9"))
	assert.False(t, versionAtLeast("0.70.4", "1.0.0"))
	assert.False(t, versionAtLeast("0.9.99", "1.0"))
}

func TestParseList(t *testing.T) {
	assert.Equal(t, []string{"Ubuntu", "oac-demo"}, parseList("Ubuntu\n\noac-demo\n  \n"))
	assert.Empty(t, parseList(""))
}

func TestClassifyMapsWSLErrorCodes(t *testing.T) {
	exit := errors.New("exit status 1")
	tests := []struct {
		out  string
		want error
		fix  string
	}{
		{"A distribution with the supplied name already exists.\nError code: Wsl/Service/RegisterDistro/ERROR_ALREADY_EXISTS", provider.ErrExists, ""},
		{"There is no distribution with the supplied name.\nError code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND", ErrNotFound, ""},
		{"Windows Subsystem for Linux has no installed distributions.\nError code: Wsl/WSL_E_DEFAULT_DISTRO_NOT_FOUND", ErrNotFound, ""},
		{"Please enable the Virtual Machine Platform Windows feature.\nError code: Wsl/Service/RegisterDistro/CreateVm/HCS/HCS_E_HYPERV_NOT_INSTALLED", provider.ErrUnavailable, "Virtual Machine Platform"},
		{"Error code: Wsl/WSL_E_WSL_OPTIONAL_COMPONENT_REQUIRED", provider.ErrUnavailable, "install or update WSL"},
	}
	for _, tt := range tests {
		err := classify("import oac-a", tt.out, exit)
		assert.ErrorIs(t, err, tt.want, tt.out)
		assert.Contains(t, err.Error(), "wsl: import oac-a: ")
		assert.Contains(t, err.Error(), tt.fix)
	}
	err := classify("import oac-a", "The specified file is not a valid tar archive.\r\nError code: Wsl/Service/RegisterDistro/0x8007017c", exit)
	assert.EqualError(t, err, "wsl: import oac-a: The specified file is not a valid tar archive. Error code: Wsl/Service/RegisterDistro/0x8007017c")
	assert.EqualError(t, classify("terminate", "", exit), "wsl: terminate: exit status 1")
	long := classify("x", string(make([]byte, 2000)), exit)
	assert.LessOrEqual(t, len(long.Error()), 600, "bounded")
}
