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
// (hashicorp/yamux v0.1.2, carried as internal/yamux with one fix: a
// stream blocked in Read or Write ends when its session shuts down). The
// guest is always the yamux client: it connects (or, on stdio and serial, speaks first), so a ready guest never
// waits for a host dial to time out. Inside the session every stream, in
// either direction, starts with one StreamHeader frame that names its kind.
// Neither side changes yamux's bytes; both write each yamux frame, header
// and body, in one write (Coalesce) and ask for TransportBuffer socket
// buffers on a socket transport (TuneTransport), so that a frame costs the
// peer one wakeup, not two.
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
//	0x0002  Welcome       host -> guest  {"version","host_version","capabilities","time_unix_nano","allow_loopback_link"}
//	0x0003  Bootstrap     host -> guest  bootstrap.Bootstrap (package bootstrap)
//	0x0004  State         guest -> host  {"state","message","reason","process","url","username"}
//	0x0005  Shutdown      host -> guest  {"reason","grace_ms"}
//	0x0006  Error         either way     {"code","message","min_version","max_version"}
//	0x0007  StreamHeader  stream opener  {"kind","name","host","port","via","src_port"}
//	0x0008  EgressReply   host -> guest  {"code","error","effect","reason","rule"} (egress streams only)
//	0x0009  Process       guest -> host  {"name","pid","running","exit_code","signal","restarts","restart_in_ms"}
//	0x000A  DNSReply      host -> guest  {"code","error","effect","reason","rule"} (dns streams only)
//	0x000B  Time          host -> guest  {"time_unix_nano"} (only to a guest whose Hello lists "time")
//	0x000C  Abort         guest -> host  {"stream"} (only to a host whose Welcome lists "abort")
//	0x0011  Clock         host -> guest  {"op":"read"|"step","id","step_ns"} (only to a guest whose Hello lists "clock")
//	                      guest -> host  {"op":"reading","id","time_unix_nano"|"error"}, {"op":"jump","step_ns","late_ns"}
//
// Data plane frames (never on the session; see "Data plane"):
//
//	0x000D  Channel       guest -> host  {"token"} first frame of the fd channel
//	                      host -> guest  {} the channel is up
//	0x000E  Connect       guest -> host  {"id","token","host","port","via","src_port","hand","reply","early"} (+ 1 descriptor when "hand")
//	0x000F  Connected     host -> guest  {"id","code","error","effect","reason","rule"} (+ 1 descriptor on the fd channel when code is 0)
//	0x0010  Forward       host -> guest  {"port","name"} + 1 descriptor (fd channel only)
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
// "abort" in Welcome means the host takes Abort: the guest's side of its
// egress stream with that yamux id is gone for good (the workload's
// client was killed or reset the connection), and the host closes the
// upstream connection at once. A yamux close is only a half-close, so
// without Abort the host would carry the upstream's bytes into a stream
// nobody reads until yamux's StreamCloseTimeout.
//
// In Hello, "forward" means the guest accepts forward streams (the host
// opens none otherwise) and "time" means the guest sets its clock from Time
// messages (VM guests, which lose time while the host sleeps); the host
// sends Time only to a guest that listed it, on the control stream, with
// its wall clock stamped at the moment of sending.
//
// "clock" keeps a VM guest's clock in step after Welcome. In Hello it
// means the guest answers Clock reads and steps; in Welcome, that the host
// keeps its clock (the provider's guests have a clock of their own) and
// takes jump reports. Only when both listed it: the host sends
// {"op":"read","id"}, the guest answers at once {"op":"reading","id",
// "time_unix_nano"} with its wall clock; the host sends {"op":"step","id",
// "step_ns"} (non-zero, at most MaxClockStep either way), the guest adds
// step_ns to its wall clock unless the result lies outside ClockFloor and
// ClockCeiling, and answers with a reading taken after the step, or with
// "error" (at most MaxClockError bytes, no control characters) instead of
// the time when it did not step. ids are 1..2^64-1, new for each question;
// the host waits ClockAnswerTimeout for an answer and ignores one that
// answers nothing it waits for. The guest sends {"op":"jump","step_ns",
// "late_ns"} when it saw its wall clock move step_ns apart from its
// monotonic clock, or its own watch wake late_ns late (the VM did not
// run); the host only checks the clock soon. Clock.Validate says which
// side sends which op with which fields.
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
//	egress    guest      EgressReply from the host, then raw bytes both ways if it said OK
//	dns       guest      one DNSReply from the host, then the host closes the stream
//	forward   host       raw bytes both ways to 127.0.0.1:PORT inside the guest
//
// # Forward streams
//
// The host opens one forward stream per connection it accepted on a
// forward's listener (ingress: how the host reaches the daemon). Its
// StreamHeader carries kind "forward", port 1..65535 and optionally a name
// (informational); host and via must be absent: the guest dials
// 127.0.0.1:port and nothing else, so no header can make it reach another
// address. When the dial fails the guest closes the stream; otherwise the
// stream carries the connection's bytes both ways, a closed write half
// being the TCP half-close. Only a guest whose Hello lists "forward" gets
// forward streams. The guest bounds how many it serves at once
// (MaxStreams); the host bounds them per shim (--forward-max-streams).
//
// # Egress streams
//
// The host lists the capability "egress" in Welcome when it runs a broker;
// only then does the guest start its proxies and open egress streams. A
// guest opens one egress stream per outbound connection. Its StreamHeader
// names the target:
//
//	kind  "egress"
//	host  a DNS name or an IP literal (IPv6 without brackets), exactly as the
//	      client gave it, 1..1024 bytes of UTF-8 without control characters,
//	      spaces or slashes; the host normalizes it (case, trailing dot, IDNA,
//	      odd IPv4 spellings) and never trusts it
//	port  1..65535
//	via   "connect" (HTTP CONNECT), "http" (forwarded http:// request),
//	      "socks5" or "transparent" (a TCP connection captured in the
//	      guest from a program that ignores proxies; host is then the name
//	      the program resolved, or the IP literal it connected to);
//	      informational, for events
//	src_port  0..65535, the source port of the workload client's
//	      connection in the guest (0 or absent: none); informational,
//	      the guest's word, for events (a host reads it from a handed
//	      socket instead)
//
// (host, port, via and src_port must be absent on every other kind.) The guest sends
// nothing else until the host answers with exactly one EgressReply frame
// (at most MaxHeaderFrame bytes):
//
//	code    0 OK, or a failure code: 1 InvalidArgument, 2 UnsupportedNetwork,
//	        3 Denied, 4 NameNotResolved, 5 NameResolutionFailed,
//	        6 ConnectionRefused, 7 Unreachable, 8 TimedOut,
//	        9 ResourceExhausted, 10 Cancelled, 11 IO, 12 Unknown
//	error   the code's name; absent when OK
//	effect  "none" or "possible" (the upstream may have seen something,
//	        e.g. a connect that timed out); absent when OK
//	reason  why, in words (at most 512 bytes, no control characters)
//	rule    the policy rule that decided, when one did
//
// After OK, the stream carries the connection's bytes both ways; each side
// closing its write half (yamux FIN) is the TCP half-close. After a failure
// code the host closes the stream. A host without a broker answers
// UnsupportedNetwork. The guest waits at most EgressReplyTimeout (60 s) for
// the answer; the host answers within its connect timeout (default 10 s).
// How many egress streams may be open at once is the host broker's limit
// (default 256); the stream over it is answered ResourceExhausted, it is
// not closed unanswered.
//
// # DNS streams
//
// The host lists the capability "dns" in Welcome (beside "egress") when it
// answers dns streams; only then does the guest run its resolver and
// capture outgoing TCP (package guest/transparent). The guest opens one
// dns stream per name it has not decided recently. Its StreamHeader:
//
//	kind  "dns"
//	host  the name asked, 1..254 bytes of UTF-8 without control
//	      characters, spaces or slashes (normalized and checked by the
//	      host like an egress host)
//
// (port and via must be absent.) The host answers with exactly one
// DNSReply frame (at most MaxHeaderFrame bytes) and closes the stream:
// code 0 when the name may be resolved in the guest, else a failure code
// with effect, reason and rule as in EgressReply (3 Denied: no name rule
// or upstream covers the name, which the host then never resolves, or
// every address it resolves to is refused; 4 NameNotResolved; 1
// InvalidArgument for an address or a malformed name). No address
// crosses: the guest hands out addresses of its own and names the name
// in the egress stream of each connection, which the host checks again
// with its port. The guest makes its addresses up from GuestAddrPrefix
// (198.18.0.0/15) and maps them back to names on every path; it sends
// one as an egress host only when no name holds it, and the host's
// refusal then says so. The guest waits at most DNSReplyTimeout (10 s). A dns
// stream counts against the broker's stream limit while it is answered.
//
// # Data plane
//
// Egress and forward connections may travel beside the session instead of
// as its streams, each on a kernel stream of its own, so that no byte of
// them crosses yamux's single writer and both sides move them with
// splice(2) between sockets. Two carriers:
//
//	data_fd    the fd channel: a guest sharing the host's kernel, on a
//	           unix transport, dials the transport's socket a second time;
//	           every connection arrives on it as a socket descriptor
//	           (SCM_RIGHTS), the guest's end of a socketpair the host made
//	           in the guest's own network namespace
//	data_dial  data connections: the guest dials the transport's endpoint
//	           (vsock, or unix) once per connection and names its target
//	           on it; the connection then carries the bytes
//
// A guest lists in Hello what its transport allows ("data_fd",
// "data_hand" and "data_dial" on unix, "data_dial" on vsock); a host lists in Welcome
// what it offers, with "data_token": 32 hex digits of randomness that
// every data plane connection presents (on vsock any process of the VM can
// dial the host's port). A host offers "data_fd" only when it can make
// pairs in the guest's network namespace (it joins it with setns, which
// takes CAP_SYS_ADMIN), "data_dial" when its provider's listener takes
// more connections. A host that cannot make pairs but can receive
// descriptors lists "data_hand" without "data_fd": the fd channel for
// handed sockets only (below). A guest uses data_fd when offered, else (or when
// the fd channel does not come up) data_dial; whatever the data plane
// cannot carry (the channel failed, a dial
// failed, no answer arrived) goes as an egress stream of the session; a
// connection the host answered is never asked again. Every frame on the
// data plane is a frame as above of at most MaxHeaderFrame bytes.
//
// The fd channel. The guest dials and sends Channel{"token"}; within
// DataChannelTimeout the host answers Channel{} (the channel is up) or
// closes the connection (wrong token, a second channel, a host that
// cannot make pairs). Then the guest sends Connect frames:
//
//	id    1..2^64-1, unique among the guest's unanswered requests
//	host, port, via   as an egress stream's header, checked the same way
//	token absent
//
// The host answers each with one Connected frame naming its id, in any
// order: an EgressReply's fields (as on an egress stream: the same policy,
// limits, failure codes and events). An OK answer is written with exactly
// one descriptor attached in the same sendmsg: the guest's end of the
// connection, a connected AF_UNIX stream socket whose other end the host
// splices to the upstream; a failure carries none. The guest takes one
// descriptor per OK Connected and per Forward, in order, and holds at most
// MaxPendingFDs unclaimed (more, or a frame whose descriptor is missing,
// ends the channel). A host that did not list "data_hand" reads the
// channel with read(2), so a descriptor the guest sends is dropped by the
// kernel, never received.
//
// Handed connections ("data_hand", listed by a host beside "data_fd"):
// instead of asking for a pair, the guest may send a Connect with
// "hand":true and exactly one descriptor attached in the same sendmsg:
// the workload's own connected TCP socket (the one its proxy accepted or
// its capture took), with "reply" (at most MaxHandReply bytes, what the
// proxy answers its client on success: "200 Connection established", a
// SOCKS reply) and "early" (at most MaxHandEarly bytes the client sent
// before that answer). The host answers with a Connected that carries no
// descriptor. On OK the host writes early (and what already waits in the
// socket) to the upstream and reply to the socket, before it answers, and
// carries the connection between the two itself: no byte of
// it passes through the guest, which closes its descriptor. On a failure
// the host has closed its copy before answering, untouched, and the guest
// answers its client. The host takes only a connected TCP socket (AF_INET
// or AF_INET6, SOCK_STREAM, IPPROTO_TCP, not listening, with a peer) and
// only reads and writes it; anything else, or more than MaxPendingFDs
// descriptors no handing Connect claimed, fails the guest as hostile. A
// Connect on a data connection never hands.
//
// A hand-only channel (Welcome lists "data_hand" and not "data_fd"): the
// guest sets the channel up the same way but sends only handing Connects
// on it; a Connect asking for a pair fails the guest as hostile, and the
// host sends no Forward on it. What the guest cannot hand goes as a data
// connection when "data_dial" is offered, else as an egress stream.
//
// Direct connections ("data_direct", listed by a host beside "data_fd"
// only when started with --data-plane direct, and by a guest that can
// trap the workload's connects): a Connect with "direct":true and via
// "direct", no descriptor, reply or early bytes, asks for the host's own
// socket. The host's broker decides as for any Connect; an OK Connected
// carries one descriptor, a TCP socket of the host's network namespace
// connected to the upstream, bound to a port the host chose and carrying
// a locked socket filter that admits only the upstream's segments (see
// docs/threat-model.md, "Direct mode"). The host keeps no copy. A direct
// Connect on a channel that was not offered "data_direct" fails the guest
// as hostile.
// Forward{"port","name"} hands the guest a connection the host accepted on
// a forward's listener (port 1..65535; the guest joins it to
// 127.0.0.1:port). Either side closing its end of a connection is the TCP
// close, shutdown(SHUT_WR) the half-close. The host paces Connect frames
// to MaxRequestRate (host/dataplane) by reading more slowly, writes within
// DataWriteTimeout (a guest that stops reading loses its channel), and a
// guest that breaks the channel's protocol (a frame over the limit, of
// another type, a Connect without id) fails as hostile.
//
// Data connections. The guest dials the transport's endpoint and sends
// Connect{"token","host","port","via"} (no id) within the host's stream
// header timeout; the host answers one Connected (no id) on the same
// connection, which after an OK answer carries the bytes both ways and
// after a failure is closed. A connection without the token is closed
// unanswered. The host accepts at most MaxRequestRate a second and lets at
// most MaxStreams wait for their first frame at once. Forwards stay
// streams of the session on this carrier.
//
// # Limits enforced on read
//
//	MaxControlFrame  256 KiB  body of a control-stream frame
//	MaxHeaderFrame     4 KiB  body of a StreamHeader frame
//	HelloTimeout        10 s  from transport connect to a complete Hello
//	FrameBodyTimeout    10 s  from a frame header to the end of its body
//	MaxStreams           256  concurrent streams a host accepts from one guest
//	                          that are reading their header or are not egress
//	                          streams (egress streams have the broker's limit)
//	MaxEgressHost       1024  bytes of StreamHeader.host
//	MaxEgressText        512  bytes of EgressReply.reason and .rule
//	EgressReplyTimeout  60 s  a guest waiting for the host's EgressReply
//	MaxDNSName           254  bytes of a dns stream's host
//	DNSReplyTimeout     10 s  a guest waiting for the host's DNSReply
//	MaxDataToken          64  bytes of a data plane token read
//	DataChannelTimeout   5 s  the fd channel's setup, either side
//	DataWriteTimeout    10 s  one write of the host on the fd channel
//	MaxPendingFDs          4  descriptors a guest holds that no frame claimed
//
// # Session bounds (a host fails a guest over one)
//
//	MaxStreamWindow     1 MiB  a stream's window: no window update may take the
//	                           other side's send window beyond it
//	MaxGuestStreams       512  streams a guest opened not yet closed by both sides
//	MaxStreamOpenRate    2000  stream opens a second (burst MaxStreamOpenBurst 2000)
//	MaxPingRate             4  yamux pings a second (burst MaxPingBurst 16)
//
// A correct guest keeps under them with StreamGate (at most
// MaxGuestStreams - GuestStreamReserve streams, GuestStreamOpenRate 1000
// opens a second).
//
// # Versions
//
//	1  first version: frames, Hello/Welcome/Bootstrap/State/Shutdown/Error,
//	   StreamHeader, control and log streams; egress and forward kinds reserved.
//
// Changes within version 1 (compatible: optional JSON fields and a frame
// type sent only to a guest that opened an egress stream, which a guest
// does only when the host offered the capability):
//
//	1.1  egress streams defined: StreamHeader gains host, port and via; the
//	     EgressReply frame (0x0008); the "egress" capability in Welcome.
//	     A 1.0 host never offers the capability, so a newer guest starts no
//	     proxies there; a 1.0 guest never opens egress streams.
//	1.2  State gains "url" and "username"; the Process message (0x0009)
//	     behind the "process" capability; Bootstrap sections sandbox,
//	     sandbox_io, credentials and health.
//	1.3  dns streams and the DNSReply frame (0x000A) behind the "dns"
//	     capability; egress via "transparent". A 1.2 host never offers
//	     "dns", so a newer guest runs only its proxies there; a 1.2 guest
//	     never opens dns streams.
//	1.4  forward streams defined (StreamHeader.port on kind "forward"),
//	     behind the guest's "forward" capability in Hello; the Time message
//	     (0x000B) behind the guest's "time" capability. A 1.3 guest lists
//	     neither, so a newer host opens no forward streams to it and sends
//	     no Time; a 1.3 host never opens forward streams or sends Time.
//	1.5  a failed State gains "reason", one of the Reason* constants, so
//	     the host gives the failure its code without reading the message.
//	     A 1.4 guest sends none (the host then says guest_failed); a 1.4
//	     host ignores it.
//	1.6  Welcome gains "allow_loopback_link" (the operator's
//	     --allow-loopback-link); Bootstrap's sandbox loses it (a document
//	     naming it is refused). A 1.5 guest ignores the Welcome field and
//	     refuses a loopback Link URL; a 1.5 host never sets it.
//	1.7  the host enforces the session bounds above on every yamux frame
//	     (a 1.6 host bounded only the streams, at 576 with its default
//	     broker), and a guest keeps under them (StreamGate). A 1.6 guest
//	     lets a workload open as many streams as it makes connections, so
//	     a 1.7 host may fail it as hostile under a connect loop: update the
//	     guest image with the shim. The Abort message (0x000C) behind the
//	     host's "abort" capability; a 1.6 host never lists it, so a newer
//	     guest sends none there.
//	1.8  the data plane: capabilities "data_fd" and "data_dial" (Hello and
//	     Welcome), Welcome's "data_token", and the frames Channel (0x000D),
//	     Connect (0x000E), Connected (0x000F) and Forward (0x0010), which
//	     travel only on data plane connections. A 1.7 host offers neither
//	     capability, so a newer guest carries every connection as a
//	     stream; a 1.7 guest lists neither, so a newer host serves no data
//	     plane connection for it.
//	1.9  handed connections on the fd channel: capability "data_hand"
//	     (Hello and Welcome, beside "data_fd"), Connect's "hand",
//	     "reply" and "early", a descriptor with a handing Connect. A 1.8
//	     host never lists it, so a newer guest asks for pairs there; a 1.8
//	     guest never lists or hands, so a newer host answers it with pairs.
//	1.10 StreamHeader (egress) and Connect gain "src_port", the workload
//	     client's source port in the guest, for the host's events. A 1.9
//	     host ignores it; a 1.9 guest sends none, and its events name no
//	     source port except for a handed socket, whose peer the host
//	     reads.
//	1.11 direct connections on the fd channel: capability "data_direct"
//	     (Hello and Welcome, beside "data_fd"), Connect's "direct", via
//	     "direct", the host's locked socket with an OK Connected. A 1.10
//	     host never lists it, so a newer guest does not trap connects
//	     there; a 1.10 guest never asks, so a newer host answers it as
//	     before.
//	1.12 the Clock message (0x0011) behind "clock" (Hello and Welcome):
//	     the host reads and steps a VM guest's clock, the guest reports
//	     jumps. A 1.11 guest never lists it, so a newer host keeps only
//	     Welcome's and push_time's clock there; a 1.11 host never lists
//	     it, so a newer guest sends no jump and gets no Clock.
//	1.13 the hand-only fd channel: a host that cannot make pairs (not
//	     root) lists "data_hand" in Welcome without "data_fd". A 1.12
//	     guest keys the channel on "data_fd", so it dials data
//	     connections there as before; a 1.12 host never lists
//	     "data_hand" alone.
package protocol
