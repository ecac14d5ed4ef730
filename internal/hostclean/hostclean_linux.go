package hostclean

import (
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Interfaces lists the host's network interfaces by name.
func Interfaces() []string {
	ifs, _ := net.Interfaces()
	var out []string
	for _, i := range ifs {
		out = append(out, i.Name)
	}
	return out
}

// Chains lists "TABLE CHAIN" for every user-defined iptables chain of the
// tables (nil without iptables).
func Chains(tables ...string) []string {
	var out []string
	for _, table := range tables {
		b, err := exec.Command("iptables", "-t", table, "-S").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" {
				out = append(out, table+" "+f[1])
			}
		}
	}
	return out
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	return points
}

// UnmountUnder detaches every mount at or below dir, deepest first.
func UnmountUnder(dir string) {
	for _, p := range MountsUnder(dir) {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}
