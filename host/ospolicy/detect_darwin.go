package ospolicy

import (
	"golang.org/x/sys/unix"
)

// Detect describes the running macOS.
func Detect() OS {
	v, err := unix.Sysctl("kern.osproductversion")
	if err != nil {
		v = ""
	}
	return OS{GOOS: "darwin", Version: v, Name: "macOS " + v}
}
