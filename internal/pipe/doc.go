// Package pipe copies bytes between the two ends of a proxied connection:
// the client's socket and an egress stream in the guest, the egress stream
// and the upstream socket on the host.
//
// It owns the copy loop and its buffers. A direction that is idle reads
// into a small buffer of its own; once a read fills it, the direction
// borrows a large pooled buffer (256 KiB: small frames handed to yamux's
// single sender are what limits tunnel throughput) and hands it back as
// soon as no byte arrived for ReleaseAfter, so idle connections hold about
// 16 KiB instead of half a megabyte. It calls Read and Write itself, so Go
// never substitutes its own 32 KiB copy path (io.Copy's WriterTo/ReaderFrom
// shortcut). It counts bytes and records activity for idle timeouts.
//
// Between two kernel sockets (a TCP socket and the end of a socketpair,
// the data plane's carrier) it copies nothing itself: each direction is
// io.Copy, which Go turns into splice(2) on Linux, and no buffer of this
// process holds the bytes. Nothing may wrap such a socket (a wrapper hides
// the *net.TCPConn that Go splices from), so activity for idle timeouts
// comes from the TCP socket's TCP_INFO instead of from each read.
//
// It must not decide anything about targets or policy, parse any protocol,
// or log payloads.
package pipe
