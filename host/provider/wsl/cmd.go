package wsl

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/oac/sandbox-agent/host/provider"
)

// GuestAgentPath is where the image build puts oac-guest in the root
// filesystem tarball.
const GuestAgentPath = "/sbin/oac-guest"

// MinVersion is the oldest WSL accepted: the first release of WSL as a
// separately installed package (the inbox component of older Windows
// builds has no --version, and fixes reach only the package).
const MinVersion = "1.0.0"

// ErrNotFound: wsl.exe reported that no distribution has that name.
var ErrNotFound = errors.New("WSL distribution not found")

// DistroName is the WSL distribution that holds sandbox name.
func DistroName(name string) string { return "oac-" + name }

// Command lines of wsl.exe (arguments only).
func versionArgs() []string { return []string{"--version"} }
func listArgs() []string    { return []string{"--list", "--quiet"} }
func importArgs(distro, dir, tarball string) []string {
	return []string{"--import", distro, dir, tarball, "--version", "2"}
}

// agentArgs runs the agent; kept: a kept sandbox's distribution, where
// the agent gives /usr/local (but bin and sbin) to uid 1000.
func agentArgs(distro string, debug, kept bool) []string {
	a := []string{"-d", distro, "-u", "root", "--exec", GuestAgentPath, "--transport", "stdio://"}
	if debug {
		a = append(a, "--debug")
	}
	if kept {
		a = append(a, "--kept")
	}
	return a
}
func terminateArgs(distro string) []string  { return []string{"--terminate", distro} }
func unregisterArgs(distro string) []string { return []string{"--unregister", distro} }

// decode turns wsl.exe output into text: wsl.exe writes UTF-16LE (with
// or without a byte order mark) unless WSL_UTF8=1 is honoured; both are
// accepted. Line ends become \n.
func decode(b []byte) string {
	if len(b) >= 2 && b[0] == 0xFF && b[1] == 0xFE {
		b = b[2:]
		return normalize(utf16le(b))
	}
	if looksUTF16LE(b) {
		return normalize(utf16le(b))
	}
	return normalize(strings.TrimPrefix(string(b), "\uFEFF"))
}

// looksUTF16LE reports whether b reads as UTF-16LE text: an even length
// and mostly NUL high bytes (ASCII text).
func looksUTF16LE(b []byte) bool {
	if len(b) < 2 || len(b)%2 != 0 {
		return false
	}
	zeros := 0
	for i := 1; i < len(b); i += 2 {
		if b[i] == 0 {
			zeros++
		}
	}
	return zeros*2 >= len(b)/2
}

func utf16le(b []byte) string {
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return string(utf16.Decode(u))
}

func normalize(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\x00", "")
}

var versionRE = regexp.MustCompile(`\b(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?\b`)

// parseVersion finds the WSL version in `wsl.exe --version` output, whose
// first line is "WSL version: 2.1.5.0" (translated on localized Windows,
// hence matched by shape: the first line naming WSL with a version).
func parseVersion(out string) (string, bool) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "WSL") {
			continue
		}
		if m := versionRE.FindString(line); m != "" {
			return m, true
		}
	}
	return "", false
}

// versionAtLeast compares dotted versions numerically.
func versionAtLeast(v, min string) bool {
	a, b := strings.Split(v, "."), strings.Split(min, ".")
	for i := 0; i < len(a) || i < len(b); i++ {
		x, y := 0, 0
		if i < len(a) {
			x, _ = strconv.Atoi(a[i])
		}
		if i < len(b) {
			y, _ = strconv.Atoi(b[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// parseList returns the distribution names of `wsl.exe --list --quiet`.
func parseList(out string) []string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if n := strings.TrimSpace(line); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// classify maps a failed wsl.exe command to the provider's errors by the
// error codes wsl.exe prints (they are not translated).
func classify(what string, out string, err error) error {
	msg := strings.TrimSpace(out)
	if msg == "" {
		msg = err.Error()
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	switch {
	case strings.Contains(out, "ERROR_ALREADY_EXISTS"):
		return fmt.Errorf("%w: wsl: %s: %s", provider.ErrExists, what, msg)
	case strings.Contains(out, "WSL_E_DISTRO_NOT_FOUND"), strings.Contains(out, "WSL_E_DEFAULT_DISTRO_NOT_FOUND"),
		strings.Contains(out, "There is no distribution with the supplied name"):
		return fmt.Errorf("%w: wsl: %s: %s", ErrNotFound, what, msg)
	case strings.Contains(out, "HCS_E_HYPERV_NOT_INSTALLED"), strings.Contains(out, "WSL_E_VIRTUAL_MACHINE_PLATFORM_REQUIRED"),
		strings.Contains(out, "HCS_E_SERVICE_NOT_AVAILABLE"):
		return fmt.Errorf("%w: wsl: %s: %s (enable the Virtual Machine Platform Windows feature and virtualization in the firmware settings, then restart)",
			provider.ErrUnavailable, what, msg)
	case strings.Contains(out, "WSL_E_WSL_OPTIONAL_COMPONENT_REQUIRED"), strings.Contains(out, "WSL_E_WSL2_NEEDS_KERNEL"):
		return fmt.Errorf("%w: wsl: %s: %s (install or update WSL)", provider.ErrUnavailable, what, msg)
	}
	return fmt.Errorf("wsl: %s: %s", what, msg)
}
