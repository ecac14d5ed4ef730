// Package muxguard stands between a guest's transport and the host's yamux
// session. It reads every yamux frame header the guest sends before yamux
// sees it and ends the session at the first one no correct guest sends:
// an unknown version, type or flag, a data frame beyond the window the
// host granted, a window update that takes the host's send window beyond
// protocol.MaxStreamWindow (yamux adds it without an overflow check, and a
// wrapped window stalls the host's writes), a stream id reused or of the
// host's parity, more than MaxStreams streams open, opens or pings faster
// than their token buckets allow. It also parses the host's own frames to
// know the windows and which streams are closed, puts a deadline on every
// write to the guest, and holds the session to a receive budget: when the
// bytes the guest sent that the host has not read yet would pass
// Limits.RecvBudget, it stops reading the transport until the host reads
// (streams handed out through Conn.Track report what they read, and free
// their receive buffer when it is empty, except MaxKeptBuffers streams read
// in bulk, which keep it while busy: a new buffer per frame was most of the
// upload's cost).
//
// It owns the session's frame-level bounds. It must not read payloads,
// know stream kinds or decide what a violation does to the sandbox (the
// caller reads Conn.Err).
package muxguard
