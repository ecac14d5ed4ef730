//go:build unix

package wsl

import "github.com/oac/sandbox-agent/host/provider/kit"

// defaultWSL: there is no WSL outside Windows; a wsl.exe path must be
// given (tests run a fake one).
func defaultWSL() string { return "" }

const onlyOnWindows = "WSL runs only on Windows"

func defaultStateRoot() string { return kit.UserStateRoot("") }

// defaultStore: no store is assumed outside Windows (tests give one).
func defaultStore() string { return "" }
