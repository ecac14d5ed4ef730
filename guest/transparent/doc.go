// Package transparent is the guest side of egress for programs that
// ignore proxy variables (oac-sandbox-io, which starts with an empty
// environment; Node's fetch, ssh, git over ssh, plain TCP clients): a
// resolver on the guest's loopback and the capture of every outgoing TCP
// connection, each carried to the host broker as an egress stream exactly
// like a proxied one (via "transparent"), under the same policy.
//
// # Names
//
// The agent answers DNS on 127.0.0.1:53 (UDP and TCP); /etc/resolv.conf
// points there (the bwrap provider binds one, the VM initramfs has one,
// and otherwise the agent bind-mounts one over an existing file:
// initsys.PlaceResolvConf). For each name it asks the host once on a dns
// stream (protocol.KindDNS, answered by protocol.DNSReply); the host
// decides under the egress policy and never resolves a name no name rule
// or named upstream covers, so a denied name never becomes a DNS packet
// the host sends. An allowed name gets a fake address from 198.18.0.0/15
// (Pool; the range the broker refuses as a destination, so a fake address
// can never be dialed by mistake), stable for the agent's life; the real
// addresses stay on the host, which resolves again when a connection is
// made (one resolution per connection, checked, no rebinding window). A
// denied or nonexistent name is NXDOMAIN at once (getaddrinfo's "Name or
// service not known", not EAI_AGAIN, so nothing retries), with the host's
// reason as an Extended DNS Error (RFC 8914, code 15 Blocked) for clients
// that speak EDNS; a host that cannot answer gives SERVFAIL, never a
// timeout. AAAA questions get the name's fake IPv6 address when IPv6 is
// captured (see IPv6), an empty answer otherwise. PTR questions for fake
// addresses map back to their name; no other reverse lookup leaves the
// guest. Answers are cached 30 s (denials 5 s).
//
// # Capture
//
// The agent sets up the workload's network namespace over netlink (the
// guest's own, or one of its own that package netns made; only when lo is
// its only interface: it never takes over a real network): the fake
// range as an address of lo (on lo a prefix is local as a whole), a
// default route through lo from 198.18.0.1, and an nftables table
// (github.com/google/nftables) "oac_egress" whose nat output chain
// redirects DNS (port 53, UDP and TCP, to any address) to the resolver and
// every other TCP connection not to 127/8 to the capture listener; its
// filter output chain drops every other UDP datagram (sendmsg fails with
// EPERM at once) and counts it; the agent reports the count on the log
// stream "oac-guest/egress". The capture listener reads the original
// destination (SO_ORIGINAL_DST), maps a fake address back to its name (an
// IP literal stays an IP literal, for CIDR rules; so does a fake address
// no name holds, which the host refuses saying so) and opens an egress
// stream for name:port, as an Attempt of the guest's one way out
// (egress.Exit, the proxies' too). A refused connection to port 80 gets
// the HTTP proxy's explanatory response (403 for the policy); any other
// refusal resets the connection (the kernel has completed the handshake
// by then, and nothing else is safe to write into a protocol the guest
// does not know). Either way the host's egress event names the
// connection (the client's source port, the target), the rule and the
// reason, and the workload can ask the guest why (the refusal list of
// package egress, on the HTTP proxy). The same mapping (Pool.Unmap, the
// Exit's) serves the proxies: a client that resolved a name itself and
// hands the proxy the fake address (curl --socks5) reaches the name.
//
// # IPv6
//
// A name's fake IPv6 address is its fake IPv4 address in the last 32 bits
// of DefaultPrefix6 (protocol.GuestAddrPrefix6, a unique local /96 the
// broker refuses as a destination), so one table serves both families and
// a name holds and loses its pair together. Beside the IPv4 rules the
// agent adds the range's Self6 to lo, a default route of type local
// through lo (every IPv6 destination is local, so a connection passes the
// output hook's redirection and never leaves; a plain route through lo is
// a reject route on some kernels) and a table of family ip6 with the same
// chains, ::1 for 127.0.0.0/8, redirecting to a resolver and a capture
// listener on [::1]; the capture reads IP6T_SO_ORIGINAL_DST. A kernel
// without IPv6, with IPv6 off or without IPv6 netfilter gets nothing of
// it: the IPv4 capture stands alone, AAAA answers stay empty, and
// Transparent.Families says why for the starting event. The host dials a
// name in whichever family it has, so the guest's family never matters
// beyond the guest.
//
// # Why netfilter redirection and not a TUN device with gVisor's netstack
//
// Both were possible here: the host kernel has nf_tables and tun built in,
// and Debian's cloud kernel ships both as modules (the initramfs loads
// nf_tables, nft_chain_nat, nft_redir, nft_ct and nft_objref). Redirection
// was chosen because:
//
//   - the captured connection is an ordinary kernel TCP socket on loopback,
//     the same thing the proxy path reads, so the transparent path costs
//     about what the proxy path costs: measured with bench/egress on the
//     shared 2-core build VM (9 runs of 256 MiB, 200 connections per
//     latency run, two runs; docs/benchmarks.md has the table), transparent
//     throughput was 70-103% of the proxy path's (download 806 and 1255
//     against 1142 and 1217 MB/s, upload 1079 and 1415 against 1195 and
//     1585 MB/s) and connect plus first byte 251 and 301 against 209 us
//     (direct loopback: 50 us; the benchmark's own locked client thread
//     accounts for 20-60 us of the difference). A userspace TCP/IP
//     stack would segment and reassemble every byte in the agent, on a
//     path that is already syscall-bound (not built here, so not measured);
//   - no device node is needed: bwrap's --dev has no /dev/net/tun and a
//     guest root in a user namespace cannot mknod one, so TUN would need
//     the provider to bind the host's;
//   - no new large dependency in the static guest binary (gVisor's module
//     is several hundred packages), and the kernel keeps doing TCP
//     (window scaling, keepalives, half-close) the way programs expect.
//
// Its cost: the kernel completes the client's handshake before the host
// decides, so a refused port is a reset rather than ECONNREFUSED; netstack
// could have refused the SYN. Capture needs CAP_NET_ADMIN in the
// workload's network namespace and the resolver CAP_NET_BIND_SERVICE
// (bwrap's guest root has them, and so does the agent of an OCI or docker
// container; a --single-uid sandbox does not: it keeps the proxies only,
// and says so in a starting event).
//
// It must not decide policy (the host does), resolve names itself, let a
// name or payload reach anything but the host's egress and dns streams,
// or touch a namespace that has a network interface besides lo.
package transparent
