//go:build unix

package wsl

import (
	"fmt"
	"os"
	"path/filepath"
)

// defaultWSL: there is no WSL outside Windows; a wsl.exe path must be
// given (tests run a fake one).
func defaultWSL() string { return "" }

const onlyOnWindows = "WSL runs only on Windows"

func defaultStateRoot() string {
	if os.Geteuid() == 0 {
		return "/run/oac"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "oac")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("oac-%d", os.Geteuid()))
}
