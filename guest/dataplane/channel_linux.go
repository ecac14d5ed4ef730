package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// Forwarded handles one forward the host handed over: the guest joins c
// to 127.0.0.1:f.Port (f has been validated). It owns c.
type Forwarded func(f protocol.Forward, c net.Conn)

// Channel is the guest's side of the fd channel.
type Channel struct {
	c       *net.UnixConn
	r       *protocol.FDReader
	log     *slog.Logger
	forward Forwarded
	fwSem   chan struct{}

	wmu     sync.Mutex
	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan answer
	handed  map[uint64]bool // pending requests that handed a socket (their answer carries none)
	direct  map[uint64]bool // pending direct requests (their answer carries the host's TCP socket)
	fwConns map[net.Conn]struct{}
	err     error
	done    chan struct{}
	wg      sync.WaitGroup
}

type answer struct {
	c      net.Conn
	r      protocol.EgressReply
	handed bool // the answer to a request that handed a socket
}

// DialChannel dials ep (a unix transport) and sets up the fd channel with
// the session's token; the host answers within
// protocol.DataChannelTimeout. forward handles the host's forwards (nil:
// they are closed); at most protocol.MaxStreams are handled at once.
func DialChannel(ctx context.Context, ep transport.Endpoint, token string, forward Forwarded, log *slog.Logger) (*Channel, error) {
	if ep.Scheme != transport.SchemeUnix {
		return nil, fmt.Errorf("fd channel: needs a unix transport, not %s", ep.Scheme)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(ctx, protocol.DataChannelTimeout)
	defer cancel()
	conn, err := ep.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("fd channel: %w", err)
	}
	c := conn.(*net.UnixConn)
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if err := protocol.WriteMessage(c, protocol.TypeChannel, protocol.Channel{Token: token}); err != nil {
		c.Close()
		return nil, fmt.Errorf("fd channel: %w", err)
	}
	var ack protocol.Channel
	if err := protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeChannel, &ack); err != nil {
		c.Close()
		return nil, fmt.Errorf("fd channel: the host did not take it: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	ch := &Channel{
		c: c, r: protocol.NewFDReader(c), log: log, forward: forward, fwSem: make(chan struct{}, protocol.MaxStreams),
		pending: map[uint64]chan answer{}, handed: map[uint64]bool{}, direct: map[uint64]bool{}, fwConns: map[net.Conn]struct{}{}, done: make(chan struct{}),
	}
	ch.wg.Add(1)
	go ch.read()
	return ch, nil
}

// Open carries one egress connection: a Connect on the channel, answered
// with the guest's end of a fresh pair. It implements Carrier.
func (ch *Channel) Open(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply, bool) {
	return ch.ask(ctx, protocol.Connect{Host: host, Port: port, Via: via})
}

// Direct asks the host for its own socket connected to host:port (the
// host offered protocol.CapDataDirect): an OK answer carries it, checked
// to be a connected TCP socket, for direct mode to put in the workload's
// place (package direct). asked is false when the host was not asked.
func (ch *Channel) Direct(ctx context.Context, t egress.Target) (*net.TCPConn, protocol.EgressReply, bool) {
	c, r, asked := ch.ask(ctx, protocol.Connect{Host: t.Host, Port: t.Port, SrcPort: t.SrcPort, Via: protocol.ViaDirect, Direct: true})
	if c == nil {
		return nil, r, asked
	}
	return c.(*net.TCPConn), r, asked
}

func (ch *Channel) ask(ctx context.Context, req protocol.Connect) (net.Conn, protocol.EgressReply, bool) {
	ans := make(chan answer, 1)
	ch.mu.Lock()
	if ch.err != nil {
		err := ch.err
		ch.mu.Unlock()
		return nil, egress.LocalFailure(protocol.EgressIO, "the fd channel is closed: "+err.Error()), false
	}
	ch.next++
	id := ch.next
	ch.pending[id] = ans
	if req.Direct {
		ch.direct[id] = true
	}
	ch.mu.Unlock()
	forget := func() {
		ch.mu.Lock()
		delete(ch.pending, id)
		ch.mu.Unlock()
	}
	req.ID = id
	ch.wmu.Lock()
	_ = ch.c.SetWriteDeadline(time.Now().Add(protocol.DataWriteTimeout))
	err := protocol.WriteMessage(ch.c, protocol.TypeConnect, req)
	_ = ch.c.SetWriteDeadline(time.Time{})
	ch.wmu.Unlock()
	if err != nil {
		forget()
		ch.fail(err)
		return nil, egress.LocalFailure(protocol.EgressIO, "the fd channel failed: "+err.Error()), false
	}
	timeout := time.NewTimer(protocol.EgressReplyTimeout)
	defer timeout.Stop()
	select {
	case a := <-ans:
		if a.c == nil && a.r.OK() { // the channel ended before the answer
			return nil, egress.LocalFailure(protocol.EgressIO, "the fd channel closed before the host answered"), false
		}
		return a.c, a.r, true
	case <-ctx.Done():
		forget()
		ch.drop(ans)
		return nil, egress.LocalFailure(protocol.EgressCancelled, "cancelled while waiting for the host broker"), true
	case <-timeout.C:
		forget()
		ch.drop(ans)
		return nil, egress.LocalFailure(protocol.EgressTimedOut, "the host broker did not answer within "+protocol.EgressReplyTimeout.String()), true
	}
}

// Hand carries one egress connection by handing the host c, the
// workload's own connected TCP socket (the host offered
// protocol.CapDataHand): on an OK answer the host writes reply to c and
// early to the upstream and then moves the bytes itself, and the caller
// only closes its descriptor of c; on a refusal the host has closed its
// copy and the caller answers the client. answered is false when the host
// was not asked (the channel is gone, the frame would be too large): the
// connection may then go another way, c untouched.
func (ch *Channel) Hand(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (protocol.EgressReply, bool) {
	if len(reply) > protocol.MaxHandReply || len(early) > protocol.MaxHandEarly {
		return protocol.EgressReply{}, false
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return protocol.EgressReply{}, false
	}
	ans := make(chan answer, 1)
	ch.mu.Lock()
	if ch.err != nil {
		ch.mu.Unlock()
		return protocol.EgressReply{}, false
	}
	ch.next++
	id := ch.next
	ch.pending[id] = ans
	ch.handed[id] = true
	ch.mu.Unlock()
	// forget gives the request up; a request the host got is answered
	// all the same, without a descriptor, so it stays marked handed until
	// then (its answer must not claim the next descriptor).
	forget := func(sent bool) {
		ch.mu.Lock()
		delete(ch.pending, id)
		if !sent {
			delete(ch.handed, id)
		}
		ch.mu.Unlock()
	}
	req := protocol.Connect{ID: id, Host: host, Port: port, Via: via, Hand: true, Reply: reply, Early: early}
	ch.wmu.Lock()
	_ = ch.c.SetWriteDeadline(time.Now().Add(protocol.DataWriteTimeout))
	var werr error
	cerr := rc.Control(func(fd uintptr) { werr = protocol.SendFD(ch.c, protocol.TypeConnect, req, int(fd)) })
	_ = ch.c.SetWriteDeadline(time.Time{})
	ch.wmu.Unlock()
	if cerr != nil || errors.Is(werr, protocol.ErrFrameTooLarge) {
		forget(false)
		return protocol.EgressReply{}, false
	}
	if werr != nil {
		forget(false)
		ch.fail(werr)
		return protocol.EgressReply{}, false
	}
	timeout := time.NewTimer(protocol.EgressReplyTimeout)
	defer timeout.Stop()
	var r protocol.EgressReply
	select {
	case a := <-ans:
		if a.r.OK() && !a.handed { // the channel ended before the answer
			shutdown(rc)
			return egress.LocalFailure(protocol.EgressIO, "the fd channel closed before the host answered"), true
		}
		return a.r, true
	case <-ctx.Done():
		r = egress.LocalFailure(protocol.EgressCancelled, "cancelled while waiting for the host broker")
	case <-timeout.C:
		r = egress.LocalFailure(protocol.EgressTimedOut, "the host broker did not answer within "+protocol.EgressReplyTimeout.String())
	}
	// The host has the socket and may still carry it: end the connection
	// itself, not only this descriptor.
	forget(true)
	shutdown(rc)
	return r, true
}

// shutdown ends both directions of the socket behind rc, for every
// descriptor of it.
func shutdown(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// drop closes a connection that arrived for a request nobody waits for.
func (ch *Channel) drop(ans chan answer) {
	select {
	case a := <-ans:
		if a.c != nil {
			a.c.Close()
		}
	default:
	}
}

// read takes the host's frames until the channel ends.
func (ch *Channel) read() {
	defer ch.wg.Done()
	for {
		f, err := protocol.ReadFrame(ch.r, protocol.MaxHeaderFrame)
		if err == nil {
			err = ch.handle(f)
		}
		if err != nil {
			ch.fail(err)
			return
		}
	}
}

func (ch *Channel) handle(f protocol.Frame) error {
	switch f.Type {
	case protocol.TypeConnected:
		var r protocol.Connected
		if err := f.Decode(&r); err != nil {
			return err
		}
		if err := r.EgressReply.Validate(); err != nil {
			return err
		}
		var a answer
		a.r = r.EgressReply
		ch.mu.Lock()
		ans, ok := ch.pending[r.ID]
		a.handed = ch.handed[r.ID]
		direct := ch.direct[r.ID]
		delete(ch.pending, r.ID)
		delete(ch.handed, r.ID)
		delete(ch.direct, r.ID)
		ch.mu.Unlock()
		if r.OK() && !a.handed {
			var c net.Conn
			var err error
			if direct {
				c, err = ch.r.TakeTCP()
			} else {
				c, err = ch.r.TakeConn()
			}
			if err != nil {
				if ok {
					ans <- answer{r: protocol.EgressReply{}}
				}
				return err
			}
			a.c = c
		}
		if !ok {
			if a.c != nil { // its asker gave up
				a.c.Close()
			}
			return nil
		}
		ans <- a
		return nil
	case protocol.TypeForward:
		var fw protocol.Forward
		if err := f.Decode(&fw); err != nil {
			return err
		}
		c, err := ch.r.TakeConn()
		if err != nil {
			return err
		}
		if err := fw.Header().Validate(); err != nil || ch.forward == nil {
			c.Close()
			return nil
		}
		select {
		case ch.fwSem <- struct{}{}:
		default:
			ch.log.Warn("too many forwarded connections, refusing one", "limit", cap(ch.fwSem))
			c.Close()
			return nil
		}
		ch.mu.Lock()
		ch.fwConns[c] = struct{}{}
		ch.mu.Unlock()
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			defer func() { <-ch.fwSem }()
			defer func() {
				ch.mu.Lock()
				delete(ch.fwConns, c)
				ch.mu.Unlock()
			}()
			ch.forward(fw, c)
		}()
		return nil
	}
	return fmt.Errorf("%w: %s on the fd channel", protocol.ErrUnexpectedType, f.Type)
}

// fail ends the channel: every waiting Open is told it was not answered
// (its connection goes as an egress stream), later ones are not sent.
func (ch *Channel) fail(err error) {
	ch.mu.Lock()
	if ch.err != nil {
		ch.mu.Unlock()
		return
	}
	if errors.Is(err, net.ErrClosed) || err == nil {
		err = errors.New("closed")
	}
	ch.err = err
	pending := ch.pending
	ch.pending = map[uint64]chan answer{}
	ch.handed = map[uint64]bool{}
	ch.direct = map[uint64]bool{}
	for c := range ch.fwConns {
		c.Close()
	}
	ch.mu.Unlock()
	for _, ans := range pending {
		ans <- answer{r: protocol.EgressReply{}}
	}
	ch.c.Close()
	ch.r.Close()
	close(ch.done)
}

// Done is closed when the channel has ended.
func (ch *Channel) Done() <-chan struct{} { return ch.done }

// Close ends the channel, closes the forwarded connections it handed out
// and waits for their handlers.
func (ch *Channel) Close() error {
	ch.fail(net.ErrClosed)
	ch.wg.Wait()
	return nil
}
