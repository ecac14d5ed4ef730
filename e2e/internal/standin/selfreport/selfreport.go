// Package selfreport is shared by the stand-in fixtures: what a process
// of the workload can see of itself and of its network, as the short
// key=value texts the e2e tests compare.
package selfreport

import (
	"net"
	"os"
	"sort"
	"strings"
)

// StatusField returns a field of /proc/self/status ("?" when absent).
func StatusField(name string) string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// Caps is the process's capability sets: "inh=X prm=X eff=X amb=X"
// (hexadecimal masks, all zero for a process without capabilities).
func Caps() string {
	return "inh=" + StatusField("CapInh") + " prm=" + StatusField("CapPrm") + " eff=" + StatusField("CapEff") + " amb=" + StatusField("CapAmb")
}

// Interfaces is the network interfaces the process sees, by name, sorted
// and comma-joined, as netlink and /proc/net/dev both report them.
func Interfaces() string {
	seen := map[string]bool{}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			seen[i.Name] = true
		}
	}
	if b, err := os.ReadFile("/proc/net/dev"); err == nil {
		lines := strings.Split(string(b), "\n")
		for _, line := range lines[min(2, len(lines)):] {
			if n, _, ok := strings.Cut(line, ":"); ok {
				seen[strings.TrimSpace(n)] = true
			}
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}
