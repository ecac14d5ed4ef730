//go:build !darwin && !windows && !linux

package ospolicy

import "runtime"

// Detect describes an OS the policy does not know.
func Detect() OS { return OS{GOOS: runtime.GOOS, Name: runtime.GOOS} }
