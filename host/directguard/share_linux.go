package directguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const portRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// localPortRange reads net.ipv4.ip_local_port_range (it covers IPv6 too)
// of the calling thread's network namespace.
func localPortRange() (lo, hi int, err error) {
	b, err := os.ReadFile(portRangeFile)
	if err != nil {
		return 0, 0, fmt.Errorf("direct mode needs net.ipv4.ip_local_port_range to carve its port share: %w", err)
	}
	lo, hi, ok := parsePortRange(string(b))
	if !ok {
		return 0, 0, fmt.Errorf("direct mode cannot read net.ipv4.ip_local_port_range %q", strings.TrimSpace(string(b)))
	}
	return lo, hi, nil
}

func parsePortRange(s string) (lo, hi int, ok bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, false
	}
	lo, e1 := strconv.Atoi(f[0])
	hi, e2 := strconv.Atoi(f[1])
	if e1 != nil || e2 != nil || lo <= 0 || hi < lo || hi > 65535 {
		return 0, 0, false
	}
	return lo, hi, true
}

// slots lays shares out in the ephemeral range lo..hi: size is capped at
// half the range, and the slots together take at most half of it, so the
// host always keeps the other half.
func slots(lo, hi, size int) (capped, count int) {
	half := (hi - lo + 1) / 2
	capped = min(size, half)
	if capped <= 0 {
		return 0, 0
	}
	return capped, half / capped
}

// share is one slot, held by a flock on its lock file for as long as the
// file stays open (the kernel drops the lock when the process dies).
type share struct {
	lo, hi int
	file   *os.File
}

// takeShare takes the first free slot of the range lo..hi.
func takeShare(dir string, lo, hi, size int) (*share, error) {
	size, count := slots(lo, hi, size)
	if count == 0 {
		return nil, fmt.Errorf("direct mode cannot carve a port share from net.ipv4.ip_local_port_range %d-%d: widen the range", lo, hi)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("direct mode cannot create its port share directory: %w", err)
	}
	for n := range count {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(n)+".lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("direct mode cannot open its port share's lock file: %w", err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			continue
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("direct mode cannot lock its port share: %w", err)
		}
		s := &share{lo: lo + n*size, hi: lo + (n+1)*size - 1, file: f}
		// For whoever looks: which ports this slot is.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(fmt.Sprintf("%d-%d pid %d\n", s.lo, s.hi, os.Getpid())), 0)
		return s, nil
	}
	return nil, fmt.Errorf("direct mode cannot be guarded: every port share (%d of %d ports each, from net.ipv4.ip_local_port_range %d-%d) is in use by other sandboxes; stop one, or widen the range", count, size, lo, hi)
}

func (s *share) release() error {
	if s == nil || s.file == nil {
		return nil
	}
	err := s.file.Close() // drops the flock
	s.file = nil
	return err
}
