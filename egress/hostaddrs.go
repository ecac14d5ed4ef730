package egress

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// HostAddrs knows the addresses of this host's own interfaces, whatever
// their range: a name the policy allows that resolves to one of them (a
// service the host runs on 0.0.0.0) is refused like a refused class.
type HostAddrs interface {
	// Owner returns the interface holding a, and whether a is the host's.
	Owner(a netip.Addr) (iface string, ok bool)
}

// AddrSet is a fixed HostAddrs: addresses, and prefixes that are local as
// a whole (an IPv4 prefix on a loopback interface, such as 127.0.0.0/8).
type AddrSet struct {
	addrs    map[netip.Addr]string
	prefixes []ownPrefix
}

type ownPrefix struct {
	p     netip.Prefix
	iface string
}

// NewAddrSet returns an empty set; Add fills it.
func NewAddrSet() *AddrSet { return &AddrSet{addrs: map[netip.Addr]string{}} }

// Add records a (unmapped, without zone) as an address of iface.
func (s *AddrSet) Add(a netip.Addr, iface string) {
	s.addrs[a.Unmap().WithZone("")] = iface
}

// AddPrefix records every address of p as the host's.
func (s *AddrSet) AddPrefix(p netip.Prefix, iface string) {
	s.prefixes = append(s.prefixes, ownPrefix{p.Masked(), iface})
}

// Owner implements HostAddrs.
func (s *AddrSet) Owner(a netip.Addr) (string, bool) {
	if s == nil {
		return "", false
	}
	a = a.Unmap().WithZone("")
	if n, ok := s.addrs[a]; ok {
		return n, true
	}
	for _, p := range s.prefixes {
		if p.p.Contains(a) {
			return p.iface, true
		}
	}
	return "", false
}

// Len returns how many addresses and prefixes the set holds.
func (s *AddrSet) Len() int { return len(s.addrs) + len(s.prefixes) }

// interfaceAddrs reads the interfaces' addresses the portable way (the
// fallback where netlink is not available).
func interfaceAddrs() (*AddrSet, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	s := NewAddrSet()
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			s.Add(ip, i.Name)
			if ones, _ := ipn.Mask.Size(); i.Flags&net.FlagLoopback != 0 && ip.Is4() {
				s.AddPrefix(netip.PrefixFrom(ip, ones), i.Name)
			}
		}
	}
	return s, nil
}

// polledAddrs re-reads the interfaces when its copy is older than maxAge,
// at the moment an address is checked.
type polledAddrs struct {
	maxAge time.Duration
	mu     sync.Mutex
	at     time.Time
	cur    *AddrSet
}

func (p *polledAddrs) Owner(a netip.Addr) (string, bool) {
	p.mu.Lock()
	if p.cur == nil || time.Since(p.at) > p.maxAge {
		if s, err := interfaceAddrs(); err == nil {
			p.cur, p.at = s, time.Now()
		}
	}
	s := p.cur
	p.mu.Unlock()
	return s.Owner(a)
}

// watchedAddrs is kept current by a watcher (netlink on Linux).
type watchedAddrs struct{ cur atomic.Pointer[AddrSet] }

func (w *watchedAddrs) Owner(a netip.Addr) (string, bool) { return w.cur.Load().Owner(a) }

// WatcherFunction is the function of the goroutine that keeps
// SystemHostAddrs current; it runs for the life of the process (for
// goleak.IgnoreAnyFunction in tests).
const WatcherFunction = "github.com/oac/sandbox-agent/egress.(*watchedAddrs).follow"

var system struct {
	once sync.Once
	h    HostAddrs
}

// SystemHostAddrs returns this host's addresses, kept current as
// interfaces come, go and change address: on Linux a netlink
// subscription to address changes (the set is re-read on each one); else,
// and where netlink fails, the interfaces are re-read when a check finds
// its copy older than a second. One watcher serves the whole process.
func SystemHostAddrs() HostAddrs {
	system.once.Do(func() {
		if w, err := watchHostAddrs(); err == nil {
			system.h = w
			return
		}
		system.h = &polledAddrs{maxAge: time.Second}
	})
	return system.h
}
