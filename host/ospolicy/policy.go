package ospolicy

import (
	"fmt"
	"strconv"
	"strings"
)

// Level is a verdict's severity.
type Level string

// Levels.
const (
	// OK: sandboxes run; nothing to say.
	OK Level = "ok"
	// Warn: sandboxes run; the user should be told Message.
	Warn Level = "warn"
	// Block: sandboxes must not run; Message says why.
	Block Level = "block"
)

// OS describes the running operating system.
type OS struct {
	// GOOS is runtime.GOOS: darwin, windows, linux, ...
	GOOS string `json:"goos"`
	// Version is the product version: "14.2.1" on macOS, "10.0" on
	// Windows, the kernel release on Linux.
	Version string `json:"version"`
	// Build is the Windows build number (22631, 19045, ...); 0 elsewhere.
	Build int `json:"build,omitempty"`
	// Name is a human-readable name ("macOS 14.2.1", "Windows 11 (build
	// 22631)", "Debian GNU/Linux 12 (bookworm)").
	Name string `json:"name"`
}

// Verdict is the policy's decision for one OS.
type Verdict struct {
	Level   Level  `json:"level"`
	Message string `json:"message"`
}

// Windows builds the policy names.
const (
	// Windows11Build is the first Windows 11 build (21H2).
	Windows11Build = 22000
	// Windows10Build22H2 is Windows 10 22H2, the last Windows 10 release.
	Windows10Build22H2 = 19045
)

// MinMacOSMajor is the oldest macOS sandboxes run on.
const MinMacOSMajor = 12

// Evaluate applies the policy table to o.
func Evaluate(o OS) Verdict {
	switch o.GOOS {
	case "darwin":
		return evalMacOS(o)
	case "windows":
		return evalWindows(o)
	case "linux":
		return Verdict{OK, "Linux: sandboxes run with bubblewrap, qemu or an OCI runtime (see oac-shim check)"}
	}
	return Verdict{Warn, fmt.Sprintf("%s is not a platform oac sandboxes are built for (macOS 12+, Windows 10 22H2+ with WSL2, Linux); nothing here is tested", o.GOOS)}
}

func evalMacOS(o OS) Verdict {
	major, ok := macOSMajor(o.Version)
	if !ok {
		return Verdict{Warn, fmt.Sprintf("could not read the macOS version (%q); sandboxes need macOS %d (Monterey) or newer", o.Version, MinMacOSMajor)}
	}
	if major < MinMacOSMajor {
		return Verdict{Block, fmt.Sprintf("macOS %s is not supported: sandboxes need macOS %d (Monterey) or newer. "+
			"They run in a virtual machine of Apple's Virtualization.framework, and the parts they rely on "+
			"(the virtio-fs share of the workspace and a stable Linux boot loader with virtio sockets) arrived in macOS %d. "+
			"Update macOS to use sandboxes.", o.Version, MinMacOSMajor, MinMacOSMajor)}
	}
	return Verdict{OK, fmt.Sprintf("macOS %s: sandboxes run in Virtualization.framework virtual machines", o.Version)}
}

// macOSMajor returns the major number of a macOS version such as "12.7.1"
// or "10.15.7".
func macOSMajor(v string) (int, bool) {
	head, _, _ := strings.Cut(strings.TrimSpace(v), ".")
	n, err := strconv.Atoi(head)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

func evalWindows(o OS) Verdict {
	switch {
	case o.Build >= Windows11Build:
		return Verdict{OK, fmt.Sprintf("Windows 11 (build %d): sandboxes run in managed WSL2 distributions", o.Build)}
	case o.Build >= Windows10Build22H2:
		return Verdict{Warn, fmt.Sprintf("Windows 10 22H2 (build %d): sandboxes run, but Windows 10 is out of mainstream support "+
			"and WSL2 receives fixes on Windows 11 first; upgrade to Windows 11 when you can", o.Build)}
	case o.Build > 0:
		return Verdict{Warn, fmt.Sprintf("Windows build %d is older than Windows 10 22H2 (build %d) and no longer receives security updates: "+
			"sandboxes will try to run, but WSL2 features they depend on may be missing or broken. "+
			"Update Windows (Settings > Windows Update) to Windows 11, or at least Windows 10 22H2", o.Build, Windows10Build22H2)}
	}
	return Verdict{Warn, "could not read the Windows build number: sandboxes will try to run; they need Windows 10 22H2 or newer with WSL2"}
}
