package wsl

import (
	"os"
	"os/exec"
	"path/filepath"
)

// defaultWSL finds wsl.exe (System32 first: it is not always on PATH of a
// desktop app's process).
func defaultWSL() string {
	if root := os.Getenv("SystemRoot"); root != "" {
		p := filepath.Join(root, "System32", "wsl.exe")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("wsl.exe")
	return p
}

const onlyOnWindows = ""

// defaultStateRoot is %LOCALAPPDATA%\oac (the distros' disks live there).
func defaultStateRoot() string {
	if d := os.Getenv("LOCALAPPDATA"); d != "" {
		return filepath.Join(d, "oac")
	}
	return filepath.Join(os.TempDir(), "oac")
}

// defaultStore is %LOCALAPPDATA%\oac\store, where the desktop app stages
// the pinned artifacts (oac-image stage --store).
func defaultStore() string { return filepath.Join(defaultStateRoot(), "store") }
