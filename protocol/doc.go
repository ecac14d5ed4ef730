// Package protocol defines the wire protocol spoken between oac-guest (inside
// the sandbox) and oac-shim (on the host) over one byte stream.
//
// It owns the frame codec, the message types and their JSON bodies, version
// negotiation, stream headers, the yamux configuration and the limits that are
// enforced on read. It must not know about providers, processes or policy:
// both binaries import it, and it never trusts the peer.
//
// # Layers
//
// One transport byte stream (see package transport) carries one yamux session
// (github.com/hashicorp/yamux). The guest is always the yamux client: it
// connects (or, on stdio and serial, speaks first), so a ready guest never
// waits for a host dial to time out. Inside the session every stream, in
// either direction, starts with one StreamHeader frame that names its kind.
//
// # Frame layout
//
// All integers are big-endian.
//
//	offset  size  field
//	0       2     type    message type, see below
//	2       2     flags   reserved, must be 0 in version 1 (non-zero is an error)
//	4       4     length  number of body bytes that follow
//	8       N     body    JSON object for every type defined in version 1
//
// A reader checks the length against its limit before it reads the body, so a
// peer can never make the other side allocate more than the limit. A body must
// be exactly one JSON object with no trailing data; unknown JSON fields are
// ignored (newer peers may add optional fields within a version), unknown frame
// types are an error.
//
// # Messages (version 1)
//
//	type    name          direction      body
//	0x0001  Hello         guest -> host  {"min_version","max_version","agent_version","pid","capabilities"}
//	0x0002  Welcome       host -> guest  {"version","host_version","capabilities","time_unix_nano"}
//	0x0003  Bootstrap     host -> guest  bootstrap.Bootstrap (package bootstrap)
//	0x0004  State         guest -> host  {"state","message","process","url","username"}
//	0x0005  Shutdown      host -> guest  {"reason","grace_ms"}
//	0x0006  Error         either way     {"code","message","min_version","max_version"}
//	0x0007  StreamHeader  stream opener  {"kind","name"}
//	0x0008  Process       guest -> host  {"name","pid","running","exit_code","signal","restarts","restart_in_ms"}
//
// Capabilities (Hello and Welcome "capabilities"): "process" in Welcome
// means the host accepts Process messages; a guest never sends one to a
// host that did not list it (an older host would refuse the unknown type).
// A Process message reports one process event: started (running, pid,
// restarts so far), exited (exit_code or signal) or restarting (restarts
// counting this one, restart_in_ms the backoff before it). A ready State
// carries the daemon's URL inside the guest and the Basic auth username;
// no message ever carries the daemon's password except Bootstrap.
//
// # Control stream
//
// The guest opens the first stream with StreamHeader{kind:"control"} and sends
// Hello. The host answers Welcome (the highest version both speak) or, when the
// ranges do not overlap, Error{code:"version_mismatch"} carrying its own range,
// and both sides fail with "protocol version mismatch: guest speaks A..B, host
// C..D". After Welcome the host sends Bootstrap; the guest applies it and
// reports State messages ("starting", "ready", "failed", "stopped"): it
// writes the private oac-sandbox-io file, starts oac-sandbox-io and the
// daemon, reports "starting" with "bootstrap complete" once both started,
// polls the daemon's health and then reports "ready". Shutdown
// asks the guest to stop its processes (TERM, grace, KILL) and report
// "stopped". Error ends the session from either side.
//
// # Other streams
//
//	kind      opened by  after the header
//	control   guest      framed messages as above (exactly one per session)
//	log       guest      raw process output; the header's name says which ("daemon/stdout")
//	egress    guest      reserved: outbound connection through the host broker
//	forward   host       reserved: inbound connection to a guest port
//
// # Limits enforced on read
//
//	MaxControlFrame  256 KiB  body of a control-stream frame
//	MaxHeaderFrame     4 KiB  body of a StreamHeader frame
//	HelloTimeout        10 s  from transport connect to a complete Hello
//	FrameBodyTimeout    10 s  from a frame header to the end of its body
//	MaxStreams           256  concurrent streams a host accepts from one guest
//
// # Versions
//
//	1  first version: frames, Hello/Welcome/Bootstrap/State/Shutdown/Error,
//	   StreamHeader, control and log streams; egress and forward kinds reserved.
//	   Compatible additions within 1: State "url" and "username"; the
//	   Process message (0x0008) behind the "process" capability; Bootstrap
//	   sections sandbox, sandbox_io, credentials and health.
package protocol
