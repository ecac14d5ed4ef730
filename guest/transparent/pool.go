package transparent

import (
	"net/netip"
	"strings"
	"sync"

	"github.com/oac/sandbox-agent/protocol"
)

// Pool hands out guest-only addresses for names, one per name, stable for
// the pool's life. They are never seen outside the guest: a connection to
// one is carried as an egress stream naming the name.
type Pool struct {
	prefix netip.Prefix
	// first is the first address handed out; the ones below it are the
	// guest's own (Self).
	first netip.Addr
	mu    sync.Mutex
	next  netip.Addr
	byNm  map[string]netip.Addr
	byIP  map[netip.Addr]string
}

// DefaultPrefix is the range fake addresses come from: 198.18.0.0/15
// (RFC 2544 benchmarking, protocol.GuestAddrPrefix), which the host
// broker refuses as a destination, so a fake address that escaped could
// never be dialed.
var DefaultPrefix = protocol.GuestAddrPrefix

// NewPool returns a pool over prefix (IPv4). Its first usable address is
// Self, the guest's own source address for captured connections.
func NewPool(prefix netip.Prefix) *Pool {
	prefix = prefix.Masked()
	self := prefix.Addr().Next()
	first := self.Next()
	return &Pool{prefix: prefix, first: first, next: first, byNm: map[string]netip.Addr{}, byIP: map[netip.Addr]string{}}
}

// Prefix returns the pool's range.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Self is the guest's own address in the range (the route's source).
func (p *Pool) Self() netip.Addr { return p.prefix.Addr().Next() }

// Contains reports whether a is in the pool's range (or is the IPv6
// form of an address in it).
func (p *Pool) Contains(a netip.Addr) bool { return p.prefix.Contains(as4(a)) }

// Addr returns the address of name, assigning the next free one when name
// has none. When the range is used up it starts again from the beginning
// and the name that held an address loses it (after 131,070 names).
func (p *Pool) Addr(name string) netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.byNm[name]; ok {
		return a
	}
	a := p.next
	n := a.Next()
	if !p.prefix.Contains(n) || isBroadcast(n, p.prefix) {
		n = p.first
	}
	p.next = n
	if old, ok := p.byIP[a]; ok {
		delete(p.byNm, old)
	}
	p.byNm[name] = a
	p.byIP[a] = name
	return a
}

// Name returns the name an address (either family's) was handed out for.
func (p *Pool) Name(a netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.byIP[as4(a)]
	return n, ok
}

// Unmap returns the name a made-up address was handed out for when host
// is one (in any spelling netip parses, brackets allowed), else host
// unchanged: an address no name holds stays an address, which the host
// refuses saying why.
func (p *Pool) Unmap(host string) string {
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if err != nil || !p.Contains(a) {
		return host
	}
	if n, ok := p.Name(a); ok {
		return n
	}
	return host
}

// Len returns how many names hold an address.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byNm)
}

func isBroadcast(a netip.Addr, pfx netip.Prefix) bool {
	b := a.As4()
	bits := pfx.Bits()
	for i := bits; i < 32; i++ {
		if b[i/8]&(0x80>>(i%8)) == 0 {
			return false
		}
	}
	return true
}
