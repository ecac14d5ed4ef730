package ospolicy

import (
	"bufio"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Detect describes the running Linux: the distribution's PRETTY_NAME and
// the kernel release.
func Detect() OS {
	o := OS{GOOS: "linux", Name: "Linux"}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		o.Version = unix.ByteSliceToString(u.Release[:])
	}
	if f, err := os.Open("/etc/os-release"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "PRETTY_NAME="); ok {
				o.Name = strings.Trim(v, `"'`)
			}
		}
	}
	if o.Version != "" {
		o.Name += " (kernel " + o.Version + ")"
	}
	return o
}
