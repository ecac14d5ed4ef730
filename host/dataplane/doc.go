// Package dataplane is the host's side of the data plane: egress and
// forward connections carried beside the session, each on a kernel stream
// of its own, instead of as streams of the session's one yamux connection
// (see protocol, "Data plane").
//
// It owns the two carriers and their bounds:
//   - the fd channel (a guest sharing this kernel, on a unix transport,
//     with a shim that is root): the guest's second connection on the
//     transport; each Connect is answered with one end of a socketpair
//     made in the guest's own network namespace (a thread of this process
//     joins it once per channel), and forwards are handed over the same
//     way. The host keeps its end and the upstream socket and splices
//     between them. A Connect that hands the workload's own TCP socket
//     over (protocol.CapDataHand) is carried between that socket and the
//     upstream, with no pair. A shim that cannot join the namespace
//     (not root) offers the channel for handed sockets only (CapDataHand
//     without CapDataFD): receiving a descriptor takes no privilege;
//   - dialed data connections (a vsock transport, or a rootless shim on a
//     unix one, for what the guest cannot hand): the guest dials the transport's listener once per
//     connection and names its target; the connection then carries the
//     bytes.
//
// Both ask the egress broker (package egress) through the same
// Attempt as an egress stream: one code path decides, limits and emits
// events. It bounds what a hostile guest can make it hold: frames of at
// most protocol.MaxHeaderFrame, requests paced to MaxRequestRate, writes
// within protocol.DataWriteTimeout, data connections that must name their
// target within a header timeout, and descriptors: at most the broker's
// stream limit of pairs at once (docs/threat-model.md counts them).
//
// It must not decide anything about targets, take a descriptor the guest
// sends except the one connected TCP socket of a handing Connect (without
// CapDataHand the channel is read with read(2), which drops them; a
// handed socket is only read and written, never connected, bound or
// listened on), or hand the guest any socket but its end of a pair made
// in its own network namespace: never a socket of the host's network
// namespace, with one exception: a direct Connect (protocol.CapDataDirect,
// offered only under --data-plane direct) is answered with the host's own
// upstream socket, and only after LockDirect bound it to a port of the
// host's choosing and locked a filter on it admitting nothing but that
// upstream's segments (docs/threat-model.md, "Direct mode").
package dataplane
