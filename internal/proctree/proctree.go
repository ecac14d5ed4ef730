//go:build linux

package proctree

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux architecture).
const ClockTicks = 100

// Proc is one process as its /proc/PID/stat gives it.
type Proc struct {
	PID, PPID int
	// Comm is the process's name as the kernel keeps it (at most 15
	// bytes; the process may set it to anything).
	Comm string
	// State is the state letter (R, S, D, Z, ...).
	State string
	// CPUTicks is the CPU time it used and its reaped children used
	// (utime, stime, cutime and cstime), in ClockTicks: summed over a
	// tree, a child that ended between two readings stays counted, in
	// its parent's.
	CPUTicks int64
}

// All returns every process readable now; one that ends while it reads
// is left out.
func All() []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // ended meanwhile
		}
		if p, ok := parse(pid, b); ok {
			out = append(out, p)
		}
	}
	return out
}

// parse reads a stat line: "pid (comm) state ppid ...", comm as the
// kernel wrote it, so the fields start after the last ')'.
func parse(pid int, b []byte) (Proc, bool) {
	i := bytes.LastIndexByte(b, ')')
	o := bytes.IndexByte(b, '(')
	if i < 0 || o < 0 || o > i {
		return Proc{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return Proc{}, false
	}
	p := Proc{PID: pid, Comm: string(b[o+1 : i]), State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1])
	for _, k := range f[11:15] { // utime stime cutime cstime
		v, _ := strconv.ParseInt(k, 10, 64)
		p.CPUTicks += v
	}
	return p, true
}

// Descendants returns the processes of all below pid: its children
// first, then theirs.
func Descendants(all []Proc, pid int) []Proc {
	children := map[int][]Proc{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []Proc
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	return out
}
