package transparent

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// DNS server limits.
const (
	maxDNSInflight = 256
	maxDNSConns    = 64
	dnsTCPIdle     = 10 * time.Second
	dnsAnswerBy    = 8 * time.Second
)

// DNSServer serves a Resolver over UDP and TCP on one address.
type DNSServer struct {
	Addr string
	res  *Resolver
	log  *slog.Logger
	udp  net.PacketConn
	tcp  net.Listener
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// Net makes the resolver's and the capture's sockets: in the agent's own
// network namespace (HostNet) or in the workload's (a *netns.NS).
type Net interface {
	Listen(network, address string) (net.Listener, error)
	ListenPacket(network, address string) (net.PacketConn, error)
}

// HostNet is the agent's own network namespace.
type HostNet struct{}

// Listen is net.Listen.
func (HostNet) Listen(network, address string) (net.Listener, error) {
	return net.Listen(network, address)
}

// ListenPacket is net.ListenPacket.
func (HostNet) ListenPacket(network, address string) (net.PacketConn, error) {
	return net.ListenPacket(network, address)
}

// ServeDNS listens on addr (UDP and TCP; "127.0.0.1:53" in a guest) and
// answers with res until Close.
func ServeDNS(res *Resolver, addr string, log *slog.Logger) (*DNSServer, error) {
	return ServeDNSIn(HostNet{}, res, addr, log)
}

// ServeDNSIn is ServeDNS with the sockets made by n.
func ServeDNSIn(n Net, res *Resolver, addr string, log *slog.Logger) (*DNSServer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 1; ; attempt++ {
		var err error
		if pc, err = n.ListenPacket("udp", addr); err != nil {
			return nil, err
		}
		if ln, err = n.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		// An ephemeral UDP port (addr's port 0: tests, benchmarks) may be
		// a TCP port in use: take another one.
		if !errors.Is(err, syscall.EADDRINUSE) || !ephemeral(addr) || attempt == maxEphemeralTries {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &DNSServer{Addr: pc.LocalAddr().String(), res: res, log: log, udp: pc, tcp: ln, ctx: ctx, stop: cancel}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

// maxEphemeralTries bounds ServeDNSIn's tries for a port free for both
// UDP and TCP.
const maxEphemeralTries = 16

// ephemeral reports whether addr asks for any port.
func ephemeral(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// Close stops serving and waits for the handlers.
func (s *DNSServer) Close() error {
	s.stop()
	s.udp.Close()
	s.tcp.Close()
	s.wg.Wait()
	return nil
}

func (s *DNSServer) serveUDP() {
	defer s.wg.Done()
	sem := make(chan struct{}, maxDNSInflight)
	for {
		buf := make([]byte, MaxDNSMessage)
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: the client retries
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(s.ctx, dnsAnswerBy)
			defer cancel()
			if out := s.res.Handle(ctx, buf[:n], true); out != nil {
				_, _ = s.udp.WriteTo(out, from)
			}
		}()
	}
}

func (s *DNSServer) serveTCP() {
	defer s.wg.Done()
	sem := make(chan struct{}, maxDNSConns)
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			defer c.Close()
			stop := context.AfterFunc(s.ctx, func() { c.Close() })
			defer stop()
			for {
				_ = c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				n := int(binary.BigEndian.Uint16(l[:]))
				if n > MaxDNSMessage {
					return
				}
				msg := make([]byte, n)
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				ctx, cancel := context.WithTimeout(s.ctx, dnsAnswerBy)
				out := s.res.Handle(ctx, msg, false)
				cancel()
				if out == nil {
					return
				}
				_ = c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
					return
				}
			}
		}()
	}
}
