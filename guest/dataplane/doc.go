// Package dataplane is the guest's side of the data plane: egress
// connections (and, on the fd channel, forwards) carried beside the
// session, each on a kernel stream of its own (see protocol, "Data
// plane").
//
// It owns the fd channel client (dialed once on a unix transport: each
// Connect is answered with a socket descriptor, the guest's end of a pair
// the host made in this guest's network namespace; the host's forwards
// arrive the same way), the dialer of data connections (one dial of the
// transport's endpoint per connection: vsock, or a unix transport whose
// host cannot make pairs here), Hand (the workload's own accepted TCP
// socket handed to the host on the channel, which carries it from then
// on), and the shape that makes each of them one of the guest's ways
// out (egress.Carrier: the agent lists them before the session's streams
// in its one egress.Exit, which falls back to the next when one could
// not ask the host and never asks twice about a connection it answered).
//
// It must not decide anything about targets (the host does), accept more
// than one descriptor per frame that carries one, or keep a descriptor no
// frame claimed.
package dataplane
