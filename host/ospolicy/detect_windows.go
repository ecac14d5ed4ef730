package ospolicy

import (
	"fmt"

	"golang.org/x/sys/windows"
)

// Detect describes the running Windows (RtlGetVersion is not subject to
// the manifest-based version lie of GetVersionEx).
func Detect() OS {
	v := windows.RtlGetVersion()
	o := OS{GOOS: "windows", Version: fmt.Sprintf("%d.%d", v.MajorVersion, v.MinorVersion), Build: int(v.BuildNumber)}
	name := "Windows 10"
	if o.Build >= Windows11Build {
		name = "Windows 11"
	}
	o.Name = fmt.Sprintf("%s (build %d)", name, o.Build)
	return o
}
