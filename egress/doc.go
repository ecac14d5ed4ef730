// Package egress is the broker of the sandbox's only way out: it answers
// every egress stream the guest opens. Both sides import it: oac-shim runs
// it on the host, and oac-guest's helper mode (a hosted sandbox with no
// shim beside it) runs it inside the guest, outside the workload's network
// namespace, with the same policy, checks and events.
//
// It owns the policy (exact hosts, *.suffix names and CIDR prefixes, each
// with a port or port range; named upstreams NAME:PORT=ADDR; at most 256
// rules; deny by default with no allow-all: no wildcard on a public
// suffix, no port ranges amounting to every port), the normalization of
// the target the guest names (case, trailing dot, IDNA, decimal/octal/hex
// and shortened IPv4, IPv4-mapped IPv6), the address classes that are
// refused unless a CIDR rule or a named upstream allows them (classes.go:
// the IANA special-purpose registries entry by entry, and a few more),
// the host's own interface addresses (hostaddrs*.go: watched over
// netlink; only an upstream or a CIDR rule naming the address opens one),
// resolution on the host, the dial (the checked address is the one
// dialed, once, checked again in the dialer's Control hook: no DNS
// rebinding window, and an address the host gained meanwhile is refused
// there), the limits
// (concurrent streams, connect and idle timeouts), the failure codes and
// effects of docs/contract.md, and one event per decision and per close. It
// also answers dns streams (ServeDNS): may the guest's resolver hand out
// an address for a name? Only a name a name rule or a named upstream
// covers is resolved (to answer NameNotResolved, or Denied when every
// address is refused); any other name is denied without a lookup, so a
// denied name never becomes a DNS packet from the host.
//
// The policy can be replaced while streams are open (an atomic swap):
// streams already connected keep running, new streams see the new policy.
//
// It must not trust anything in the stream header (it re-validates and
// re-normalizes), resolve a name whose port no rule allows, dial anything
// but the address it checked, log or emit payload bytes, or know how the
// guest accepted the connection beyond the header's "via".
package egress
