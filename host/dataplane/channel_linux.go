package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// Channel is the host's side of one guest's fd channel.
type Channel struct {
	c     *net.UnixConn
	r     io.Reader // c, or fr when the channel takes handed sockets
	fr    *protocol.FDReader
	cfg   Config
	pairs *pairMaker
	limit *rate.Limiter

	wmu       sync.Mutex
	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
	open      atomic.Int64
}

// serveChannel runs the fd channel on c, the guest's connection whose
// Channel frame presented the token. With protocol.CapDataFD offered the
// channel's pairs are made in the network namespace c was dialed from
// (the guest's), by a thread of this process that joins it, which takes
// CAP_SYS_ADMIN (a root shim); cfg.OnChannel gets the channel (forwards
// use its pairs). Offered protocol.CapDataHand alone (a shim without that
// privilege), the channel takes handed sockets only: receiving a
// descriptor needs no privilege, and a handed socket is only read and
// written. The guest is told (an empty Channel) and its requests are
// answered until it ends. A guest whose channel fails here carries its
// connections as data connections or egress streams.
func serveChannel(c *net.UnixConn, cfg Config) error {
	ch := &Channel{c: c, r: c, cfg: cfg, limit: rate.NewLimiter(MaxRequestRate, MaxRequestBurst), done: make(chan struct{})}
	if protocol.HasCapability(cfg.Offer, protocol.CapDataFD) {
		pm, err := newPairMaker(c)
		if err != nil {
			c.Close()
			return fmt.Errorf("fd channel: %w", err)
		}
		ch.pairs = pm
	}
	if protocol.HasCapability(cfg.Offer, protocol.CapDataHand) {
		// Descriptors the guest sends are received (at most
		// protocol.MaxPendingFDs at once) and must each be claimed by the
		// Connect they came with.
		ch.fr = protocol.NewFDReader(c)
		ch.r = ch.fr
	}
	if err := ch.send(protocol.TypeChannel, protocol.Channel{}, -1); err != nil {
		ch.Close()
		return fmt.Errorf("fd channel: %w", err)
	}
	if ch.pairs != nil {
		cfg.OnChannel(ch)
	}
	stop := context.AfterFunc(cfg.Ctx, func() { ch.Close() })
	defer stop()
	_ = ch.serve()
	return nil
}

// serve answers the guest's Connect requests until the channel ends, then
// closes it and waits for the connections it carries to end. It returns
// nil when the guest closed the channel or Close was called, and an error
// wrapping ErrViolation when the guest broke the protocol, which it
// reports (cfg.OnViolation) at once, not after the connections ended.
func (ch *Channel) serve() (err error) {
	defer ch.wg.Wait()
	defer ch.Close()
	defer func() {
		if err != nil {
			ch.cfg.violation(err)
		}
	}()
	for {
		if err := ch.limit.Wait(ch.cfg.Ctx); err != nil {
			return nil
		}
		f, err := protocol.ReadFrame(ch.r, protocol.MaxHeaderFrame)
		if err != nil {
			if errors.Is(err, protocol.ErrDescriptor) {
				return fmt.Errorf("%w: %w", ErrViolation, err)
			}
			if err = violation(err); errors.Is(err, ErrViolation) {
				return err
			}
			return nil
		}
		if f.Type != protocol.TypeConnect {
			return fmt.Errorf("%w: %s on the fd channel", ErrViolation, f.Type)
		}
		var req protocol.Connect
		if err := f.Decode(&req); err != nil {
			return violation(err)
		}
		if req.ID == 0 || req.Token != "" {
			return fmt.Errorf("%w: a Connect on the fd channel carries an id and no token", ErrViolation)
		}
		if req.Direct {
			if !protocol.HasCapability(ch.cfg.Offer, protocol.CapDataDirect) {
				return fmt.Errorf("%w: a direct Connect on a channel that was not offered %s", ErrViolation, protocol.CapDataDirect)
			}
			if err := req.Validate(); err != nil {
				return violation(err)
			}
			ch.wg.Add(1)
			go func() {
				defer ch.wg.Done()
				ch.direct(req)
			}()
			continue
		}
		if !req.Hand {
			// A descriptor may be pending here: the reader reads ahead,
			// and the next frame may be a handing Connect whose socket
			// came with it. Descriptors no frame claims are bounded by
			// the reader (protocol.MaxPendingFDs).
			if len(req.Reply) > 0 || len(req.Early) > 0 {
				return fmt.Errorf("%w: a Connect that hands no socket carries reply or early bytes", ErrViolation)
			}
			if ch.pairs == nil {
				return fmt.Errorf("%w: a Connect asking for a pair on a channel that was offered %s only", ErrViolation, protocol.CapDataHand)
			}
			ch.wg.Add(1)
			go func() {
				defer ch.wg.Done()
				ch.connect(req)
			}()
			continue
		}
		if ch.fr == nil {
			return fmt.Errorf("%w: a handed socket on a channel that was not offered %s", ErrViolation, protocol.CapDataHand)
		}
		if len(req.Reply) > protocol.MaxHandReply || len(req.Early) > protocol.MaxHandEarly {
			return fmt.Errorf("%w: a handed connection's reply or early bytes over the limit", ErrViolation)
		}
		sock, err := ch.fr.TakeTCP()
		if errors.Is(err, protocol.ErrHandedGone) {
			// The workload's client went away before its socket was
			// handed (it may reset its own connection at any moment):
			// that Connect fails, the channel goes on.
			_ = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: protocol.EgressReply{
				Code: protocol.EgressCancelled, Effect: protocol.EffectNone, Error: protocol.EgressCancelled.String(),
				Reason: "the workload's connection ended before it was handed to the host"}}, -1)
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrViolation, err)
		}
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			ch.hand(req, sock)
		}()
	}
}

// hand answers one request that handed the workload's own socket: the
// broker decides; an allowed connection is carried between that socket
// and the upstream by this process alone (after Early to the upstream and
// Reply to the socket, both before the answer), a refused one is closed here before the guest
// hears of it, so the guest's copy is the socket's last.
func (ch *Channel) hand(req protocol.Connect, sock *net.TCPConn) {
	ch.open.Add(1)
	defer ch.open.Add(-1)
	// The connection's source port is the socket's peer's, as the
	// kernel says, not the guest's word.
	req.SrcPort = 0
	if a, ok := sock.RemoteAddr().(*net.TCPAddr); ok {
		req.SrcPort = a.Port
	}
	taken := false
	defer func() {
		if !taken {
			sock.Close()
		}
	}()
	ch.cfg.answer(req, func() (net.Conn, error) {
		taken = true
		return sock, nil
	}, func(r protocol.Connected) error {
		if !r.OK() && !taken {
			sock.Close()
			taken = true
		}
		return ch.send(protocol.TypeConnected, r, -1)
	}, func(a *egress.Attempt, host net.Conn) {
		// The client's bytes first: the upstream works on them while the
		// reply, the answer and its event are written. Those the guest
		// read (Early), then those waiting in the socket (a captured
		// client writes its request as soon as it connects).
		_ = a.SendUpstream(req.Early)
		if waiting := takeWaiting(sock, maxWaiting); len(waiting) > 0 {
			_ = a.SendUpstream(waiting)
		}
		if len(req.Reply) > 0 {
			_ = sock.SetWriteDeadline(time.Now().Add(ch.cfg.WriteTimeout))
			_, _ = sock.Write(req.Reply)
			_ = sock.SetWriteDeadline(time.Time{})
		}
	})
}

// connect answers one request: the broker decides; an allowed connection
// gets a fresh pair, whose guest end goes with the answer.
func (ch *Channel) connect(req protocol.Connect) {
	guestFD := -1
	ch.open.Add(1)
	defer ch.open.Add(-1)
	defer func() {
		if guestFD >= 0 {
			_ = closeFD(guestFD)
		}
	}()
	ch.cfg.answer(req, func() (net.Conn, error) {
		host, g, err := ch.pair()
		guestFD = g
		return host, err
	}, func(r protocol.Connected) error {
		err := ch.send(protocol.TypeConnected, r, guestFD)
		if guestFD >= 0 {
			// The guest has its end now (or never will): the host keeps
			// none of it, so the guest closing it ends the connection.
			_ = closeFD(guestFD)
			guestFD = -1
		}
		return err
	}, nil)
}

// pair returns the host's end, unwrapped (so it is spliced), and the
// guest's end as a raw descriptor.
func (ch *Channel) pair() (net.Conn, int, error) {
	p, err := ch.pairs.get()
	if err != nil {
		return nil, -1, err
	}
	f := os.NewFile(uintptr(p[0]), "data plane pair")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		_ = closeFD(p[1])
		return nil, -1, err
	}
	return c, p[1], nil
}

// Forward hands the guest a connection to 127.0.0.1:port inside it and
// returns the host's end. name is informational.
func (ch *Channel) Forward(port int, name string) (net.Conn, error) {
	if ch.pairs == nil {
		return nil, fmt.Errorf("forward to guest port %d: this fd channel takes handed sockets only", port)
	}
	fw := protocol.Forward{Port: port, Name: name}
	if err := fw.Header().Validate(); err != nil {
		return nil, err
	}
	host, g, err := ch.pair()
	if err != nil {
		return nil, fmt.Errorf("forward to guest port %d: %w", port, err)
	}
	err = ch.send(protocol.TypeForward, fw, g)
	_ = closeFD(g)
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("forward to guest port %d: %w", port, err)
	}
	return host, nil
}

// send writes one frame, with fd attached when fd >= 0, within the write
// timeout (protocol.DataWriteTimeout); a failed write ends the channel.
func (ch *Channel) send(t protocol.Type, v any, fd int) error {
	ch.wmu.Lock()
	defer ch.wmu.Unlock()
	select {
	case <-ch.done:
		return net.ErrClosed
	default:
	}
	_ = ch.c.SetWriteDeadline(time.Now().Add(ch.cfg.WriteTimeout))
	err := protocol.SendFD(ch.c, t, v, fd)
	_ = ch.c.SetWriteDeadline(time.Time{})
	if err != nil {
		ch.cfg.Log.Warn("fd channel: write failed, closing it", "err", err)
		go ch.Close()
	}
	return err
}

// Open returns how many Connect requests are being answered or carried.
func (ch *Channel) Open() int64 { return ch.open.Load() }

// Done is closed when the channel has ended.
func (ch *Channel) Done() <-chan struct{} { return ch.done }

// Close ends the channel: no request or forward is taken after it. The
// connections already carried run on until they end (the sandbox's
// context ends them when it stops).
func (ch *Channel) Close() error {
	ch.closeOnce.Do(func() {
		close(ch.done)
		ch.c.Close()
		if ch.fr != nil {
			ch.fr.Close()
		}
		if ch.pairs != nil {
			ch.pairs.stop()
		}
	})
	return nil
}

// maxWaiting bounds what takeWaiting reads ahead of the carry.
const maxWaiting = 16 << 10

// takeWaiting reads what is already in sock's receive queue, at most max
// bytes, without waiting. It asks the queue's length first (SIOCINQ) and
// reads only when there are bytes, so a pending error or end of stream is
// left for the carry to see.
func takeWaiting(sock *net.TCPConn, max int) []byte {
	rc, err := sock.SyscallConn()
	if err != nil {
		return nil
	}
	var out []byte
	_ = rc.Read(func(fd uintptr) bool {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil || n <= 0 {
			return true
		}
		buf := make([]byte, min(n, max))
		got, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		if err == nil && got > 0 {
			out = buf[:got]
		}
		return true
	})
	return out
}
