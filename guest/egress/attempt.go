package egress

import (
	"context"
	"net"
	"strconv"

	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/protocol"
)

// Target is one connection's destination as the workload's client named
// it, and where it came from.
type Target struct {
	// Host is a name or an IP literal without brackets, as the client
	// spelled it (an address the guest's resolver made up is already
	// mapped back to its name).
	Host string
	Port int
	Via  string
	// SrcPort is the source port of the client's connection in the guest
	// (its end of the socket the proxy or the capture accepted), 0 when
	// it has none: what the host's events and the refusal list name the
	// connection by.
	SrcPort int
}

// String is host:port.
func (t Target) String() string { return net.JoinHostPort(t.Host, strconv.Itoa(t.Port)) }

// Header is the egress stream header naming t.
func (t Target) Header() protocol.StreamHeader {
	return protocol.StreamHeader{Kind: protocol.KindEgress, Host: t.Host, Port: t.Port, Via: t.Via, SrcPort: t.SrcPort}
}

// Carrier is one way a connection leaves the guest. Exactly one of Hand,
// Open and Direct is set. Either answers false when the host was not asked (the
// carrier is not up, does not take this connection, or failed before the
// host had the question): the next carrier is tried. A connection the
// host answered is never asked again.
type Carrier struct {
	// Name says which way it is ("hand", "pair", "dial", "session",
	// "direct").
	Name string
	// Hand gives the host the client's own connected TCP socket: on an OK
	// answer the host writes reply to it and early to the upstream, then
	// carries the connection itself; the guest only closes its
	// descriptor. Tried only for a TCP client whose early bytes fit
	// protocol.MaxHandEarly.
	Hand func(ctx context.Context, c *net.TCPConn, t Target, reply, early []byte) (r protocol.EgressReply, answered bool)
	// Open opens a connection for t; the guest joins its bytes to the
	// client's. The connection is nil unless the answer is OK.
	Open func(ctx context.Context, t Target) (c net.Conn, r protocol.EgressReply, answered bool)
	// Direct asks for the host's own socket connected to t, for direct
	// mode to put in the workload's place (package guest/direct); tried
	// only by Exit.Direct, never for a proxied or captured client.
	Direct func(ctx context.Context, t Target) (c *net.TCPConn, r protocol.EgressReply, answered bool)
}

// Opener opens an egress connection for host:port and returns the host's
// answer; it always answers. The connection is nil unless the answer is
// OK.
type Opener func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply)

// Hander is the shape of a carrier that hands the client's socket and
// does not need the source port (the host reads it from the socket).
type Hander func(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (r protocol.EgressReply, answered bool)

// Opens makes open a carrier called name.
func Opens(name string, open Opener) Carrier {
	return Carrier{Name: name, Open: func(ctx context.Context, t Target) (net.Conn, protocol.EgressReply, bool) {
		c, r := open(ctx, t.Host, t.Port, t.Via)
		return c, r, true
	}}
}

// Hands makes hand a carrier called name.
func Hands(name string, hand Hander) Carrier {
	return Carrier{Name: name, Hand: func(ctx context.Context, c *net.TCPConn, t Target, reply, early []byte) (protocol.EgressReply, bool) {
		return hand(ctx, c, t.Host, t.Port, t.Via, reply, early)
	}}
}

// Exit is the guest's one way out: every connection of the proxies and
// the capture is an Attempt of it, which checks the target once, maps a
// made-up address back to its name, tries the carriers in order and
// records a refusal for the workload to ask about (Refusals).
type Exit struct {
	unmap    func(host string) string
	carriers []Carrier
	refusals *Refusals
}

// NewExit returns the guest's way out through carriers, in order of
// preference (a carrier added later, such as another kind of data plane
// connection, is one more entry). unmap, when not nil, maps an address
// the guest's resolver made up back to its name.
func NewExit(unmap func(host string) string, carriers ...Carrier) *Exit {
	if unmap == nil {
		unmap = func(h string) string { return h }
	}
	return &Exit{unmap: unmap, carriers: carriers, refusals: NewRefusals()}
}

// Refusals is the list of recent refusals the workload may ask about.
func (e *Exit) Refusals() *Refusals { return e.refusals }

// hands reports whether some carrier takes client sockets.
func (e *Exit) hands() bool {
	for _, c := range e.carriers {
		if c.Hand != nil {
			return true
		}
	}
	return false
}

// Direct is direct mode's way out (a workload's trapped connect to
// host:port, package guest/direct): the same target check and mapping as
// every Attempt, then the first carrier that answers directly. answered
// is false when none could ask the host: the connect is then made in the
// workload's namespace, where the capture carries it as any other.
// srcPort is the port the workload's socket was bound to before its
// connect (0 if none). A refusal is recorded for the workload to ask
// about, by target, and by that port when it had one.
func (e *Exit) Direct(ctx context.Context, host string, port, srcPort int) (*net.TCPConn, protocol.EgressReply, bool) {
	t := Target{Host: e.unmap(host), Port: port, Via: protocol.ViaDirect, SrcPort: srcPort}
	if err := t.Header().Validate(); err != nil {
		return nil, LocalFailure(protocol.EgressInvalidArgument, "the target is not a host name or IP address with a port in 1..65535"), true
	}
	for _, w := range e.carriers {
		if w.Direct == nil || ctx.Err() != nil {
			continue
		}
		if c, r, answered := w.Direct(ctx, t); answered {
			if !r.OK() {
				e.refusals.add(t, r)
			}
			return c, r, true
		}
	}
	return nil, protocol.EgressReply{}, false
}

// Attempt is one connection of a workload's client on its way out.
type Attempt struct {
	exit   *Exit
	ctx    context.Context
	client net.Conn
	t      Target
}

// Attempt starts one connection of client (the socket the proxy or the
// capture accepted; nil for a connection with no socket of its own, which
// no carrier may hand) to host:port.
func (e *Exit) Attempt(ctx context.Context, client net.Conn, host string, port int, via string) *Attempt {
	t := Target{Host: e.unmap(host), Port: port, Via: via}
	if client != nil {
		if a, ok := client.RemoteAddr().(*net.TCPAddr); ok {
			t.SrcPort = a.Port
		}
	}
	return &Attempt{exit: e, ctx: ctx, client: client, t: t}
}

// Target is where the attempt goes.
func (a *Attempt) Target() Target { return a.t }

// Go sends the connection on its way: handed to the host when a carrier
// takes the client's socket (mayHand; reply and early as for
// Carrier.Hand), else opened on the first carrier that answers. The
// answer is one of: refused (!r.OK()), handed (r.OK() and c nil: the host
// carries it, the caller only closes its descriptor), or c to join to the
// client (the caller writes reply and early itself).
func (a *Attempt) Go(mayHand bool, reply, early []byte) (c net.Conn, r protocol.EgressReply) {
	c, r = a.route(mayHand, reply, early)
	if !r.OK() {
		a.exit.refusals.add(a.t, r)
	}
	return c, r
}

// route is the one place a carrier is chosen.
func (a *Attempt) route(mayHand bool, reply, early []byte) (net.Conn, protocol.EgressReply) {
	if err := a.t.Header().Validate(); err != nil {
		return nil, LocalFailure(protocol.EgressInvalidArgument, "the target is not a host name or IP address with a port in 1..65535")
	}
	tc, isTCP := a.client.(*net.TCPConn)
	mayHand = mayHand && isTCP && len(reply) <= protocol.MaxHandReply && len(early) <= protocol.MaxHandEarly
	for _, w := range a.exit.carriers {
		if a.ctx.Err() != nil {
			break // stopping: no carrier is asked after the one that was
		}
		switch {
		case w.Hand != nil:
			if !mayHand {
				continue
			}
			if r, answered := w.Hand(a.ctx, tc, a.t, reply, early); answered {
				return nil, r
			}
		case w.Open != nil:
			if c, r, answered := w.Open(a.ctx, a.t); answered {
				return c, r
			}
		}
		// A Direct carrier is Exit.Direct's only.
	}
	if a.ctx.Err() != nil {
		return nil, LocalFailure(protocol.EgressCancelled, "the guest's egress is stopping")
	}
	return nil, LocalFailure(protocol.EgressIO, "no way out of the guest could ask the host (the session and the data plane are down)")
}

// Carry carries a client that waits for an answer and then talks to the
// upstream (CONNECT, SOCKS, the capture): handed when it can be, else
// opened, reply written to the client and early (what the client sent
// before the answer) to the upstream, and the two joined until both
// ends close. refuse answers the client of a refused connection.
func (a *Attempt) Carry(reply, early []byte, refuse func(protocol.EgressReply)) {
	st, r := a.Go(true, reply, early)
	if !r.OK() {
		refuse(r)
		return
	}
	if st == nil {
		return // handed: the host carries it
	}
	defer st.Close()
	if len(reply) > 0 {
		if _, err := a.client.Write(reply); err != nil {
			return
		}
	}
	if err := joinEarly(a.client, early, st); err != nil {
		Abort(st) // the host closes the upstream at once
	}
}

// joinEarly writes early to st, then joins the two sockets directly, so
// that the kernel splices between them when st is a socket too.
func joinEarly(c net.Conn, early []byte, st net.Conn) error {
	if len(early) > 0 {
		if _, err := st.Write(early); err != nil {
			return err
		}
	}
	_, _, err := pipe.Join(c, st, nil)
	return err
}
