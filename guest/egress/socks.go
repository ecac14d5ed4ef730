package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/oac/sandbox-agent/protocol"
)

// SOCKS5 constants (RFC 1928).
const (
	socksVersion      = 5
	socksNoAuth       = 0x00
	socksNoAcceptable = 0xff
	socksCmdConnect   = 1
	atypIPv4          = 1
	atypDomain        = 3
	atypIPv6          = 4
)

// SOCKS5 reply codes.
const (
	socksSucceeded           = 0x00
	socksGeneralFailure      = 0x01
	socksNotAllowed          = 0x02
	socksNetworkUnreachable  = 0x03
	socksHostUnreachable     = 0x04
	socksConnectionRefused   = 0x05
	socksTTLExpired          = 0x06
	socksCommandNotSupported = 0x07
	socksAddrNotSupported    = 0x08
)

// socksReplyCode maps a failure code to the SOCKS5 reply code.
func socksReplyCode(code protocol.EgressCode) byte {
	switch code {
	case protocol.EgressOK:
		return socksSucceeded
	case protocol.EgressDenied:
		return socksNotAllowed
	case protocol.EgressNameNotResolved, protocol.EgressNameResolutionFailed:
		return socksHostUnreachable
	case protocol.EgressConnectionRefused:
		return socksConnectionRefused
	case protocol.EgressUnreachable:
		return socksNetworkUnreachable
	case protocol.EgressTimedOut:
		return socksTTLExpired
	case protocol.EgressUnsupportedNetwork:
		return socksAddrNotSupported
	}
	return socksGeneralFailure
}

// socksError is a handshake failure with the reply code to send (0: none,
// the client is not speaking SOCKS5 or chose no acceptable method).
type socksError struct {
	reply byte
	msg   string
}

func (e *socksError) Error() string { return "socks5: " + e.msg }

// socksHandshake reads the greeting and the request from r, writes the
// method selection to w, and returns the target. On a request error it
// returns a *socksError whose reply code the caller sends.
func socksHandshake(r *bufio.Reader, w io.Writer) (Target, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Target{}, err
	}
	if hdr[0] != socksVersion {
		return Target{}, &socksError{msg: "not a SOCKS5 client (version " + strconv.Itoa(int(hdr[0])) + ")"}
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return Target{}, err
	}
	noAuth := false
	for _, m := range methods {
		noAuth = noAuth || m == socksNoAuth
	}
	if !noAuth {
		_, _ = w.Write([]byte{socksVersion, socksNoAcceptable})
		return Target{}, &socksError{msg: "client offers no 'no authentication' method"}
	}
	if _, err := w.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return Target{}, err
	}
	var req [4]byte
	if _, err := io.ReadFull(r, req[:]); err != nil {
		return Target{}, err
	}
	if req[0] != socksVersion {
		return Target{}, &socksError{reply: socksGeneralFailure, msg: "bad request version"}
	}
	var host string
	switch req[3] {
	case atypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return Target{}, err
		}
		host = netip.AddrFrom4(a).String()
	case atypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return Target{}, err
		}
		host = netip.AddrFrom16(a).String()
	case atypDomain:
		n, err := r.ReadByte()
		if err != nil {
			return Target{}, err
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(r, name); err != nil {
			return Target{}, err
		}
		host = string(name)
	default:
		return Target{}, &socksError{reply: socksAddrNotSupported, msg: "unknown address type"}
	}
	var pb [2]byte
	if _, err := io.ReadFull(r, pb[:]); err != nil {
		return Target{}, err
	}
	if req[1] != socksCmdConnect {
		return Target{}, &socksError{reply: socksCommandNotSupported, msg: "only CONNECT is supported"}
	}
	t := Target{Host: host, Port: int(binary.BigEndian.Uint16(pb[:]))}
	if (protocol.StreamHeader{Kind: protocol.KindEgress, Host: t.Host, Port: t.Port}).Validate() != nil {
		return Target{}, &socksError{reply: socksGeneralFailure, msg: "the target is not a host name or address with a port in 1..65535"}
	}
	return t, nil
}

// socksReply encodes a reply; the bound address is always 0.0.0.0:0 (the
// real one is on the host and none of the client's business).
func socksReply(code byte) []byte {
	return []byte{socksVersion, code, 0, atypIPv4, 0, 0, 0, 0, 0, 0}
}

func (p *Proxies) serveSOCKS(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(HeaderTimeout))
	br := bufio.NewReaderSize(&limitedReader{r: c, n: 1024}, 512)
	t, err := socksHandshake(br, c)
	if err != nil {
		var se *socksError
		if errors.As(err, &se) && se.reply != 0 {
			_, _ = c.Write(socksReply(se.reply))
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var early []byte
	if n := br.Buffered(); n > 0 {
		early, _ = br.Peek(n)
	}
	// The handshake reader was bounded to 1 KiB: whatever it holds past
	// the request is payload the client sent early.
	p.exit.Attempt(p.ctx, c, t.Host, t.Port, protocol.ViaSOCKS5).Carry(socksReply(socksSucceeded), early, func(r protocol.EgressReply) {
		_, _ = c.Write(socksReply(socksReplyCode(r.Code)))
	})
}
