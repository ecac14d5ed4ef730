package bwrap

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

// IDRangeEntry is one line of /etc/subuid or /etc/subgid.
type IDRangeEntry struct {
	Start, Count int
}

// ParseSubIDs returns the ranges /etc/subuid (or /etc/subgid) content r
// grants to the user named name or with the numeric id uid, in file order.
// Malformed lines are skipped, as shadow-utils does.
func ParseSubIDs(r io.Reader, name string, uid int) ([]IDRangeEntry, error) {
	var out []IDRangeEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != 3 || (f[0] != name && f[0] != strconv.Itoa(uid)) {
			continue
		}
		start, err1 := strconv.Atoi(f[1])
		count, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || start < 0 || count <= 0 || start > 1<<32-1-count {
			continue
		}
		out = append(out, IDRangeEntry{Start: start, Count: count})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read subordinate ids: %w", err)
	}
	return out, nil
}

// pickRange returns the first range large enough to hold guest ids
// 1..kit.IDRange-1 or, failing that, the largest one that still covers the
// runtime user (guest uid 1000 needs at least 1000 subordinate ids).
func pickRange(rs []IDRangeEntry) (IDRangeEntry, bool) {
	var best IDRangeEntry
	for _, r := range rs {
		if r.Count >= kit.IDRange-1 {
			return IDRangeEntry{Start: r.Start, Count: kit.IDRange - 1}, true
		}
		if r.Count > best.Count {
			best = r
		}
	}
	return best, best.Count >= 1000
}
