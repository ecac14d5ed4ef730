package dataplane

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/protocol"
)

// direct answers one direct Connect: the broker decides and dials as for
// any other carrier, with the upstream socket locked (LockDirect) before
// it connects; an allowed connection's socket goes to the guest with the
// answer and this process keeps nothing of it.
func (ch *Channel) direct(req protocol.Connect) {
	ch.open.Add(1)
	defer ch.open.Add(-1)
	if ch.cfg.Broker == nil {
		_ = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: protocol.EgressReply{
			Code: protocol.EgressUnsupportedNetwork, Effect: protocol.EffectNone, Error: protocol.EgressUnsupportedNetwork.String(),
			Reason: "this sandbox was started without an egress broker"}}, -1)
		return
	}
	a := ch.cfg.Broker.OpenDirect(ch.cfg.Ctx, req.Header(), ch.cfg.Emit, LockDirect)
	defer a.Close()
	up := a.Give()
	if up == nil {
		a.Answered(ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, -1))
		return
	}
	defer up.Close()
	var err error
	rc, cerr := up.(syscall.Conn).SyscallConn()
	if cerr == nil {
		cerr = rc.Control(func(fd uintptr) {
			err = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, int(fd))
		})
	}
	if cerr != nil {
		a.Fail(protocol.EgressResourceExhausted, "the host could not pass the direct connection's socket: "+cerr.Error())
		err = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, -1)
	}
	a.Answered(err)
}

// LockDirect prepares a direct connection's upstream socket before it
// connects to remote, so that in the guest's hands (root in the guest may
// take it from the workload) it can talk to remote and nothing else:
//
//   - it binds a local port chosen here: the kernel keeps a port the
//     owner chose when the socket is disconnected (connect with
//     AF_UNSPEC), so a disconnected socket cannot bind elsewhere, and
//     listening on it reaches nothing (below);
//   - it attaches a socket filter that admits only segments from remote's
//     address and port, and locks it (SO_LOCK_FILTER: it can be neither
//     removed nor replaced without CAP_NET_ADMIN in the host's namespace,
//     which the guest never has). A socket reconnected elsewhere never
//     completes a handshake; a listening one never sees a SYN but
//     remote's.
func LockDirect(network string, remote netip.AddrPort, rc syscall.RawConn) error {
	prog, err := peerFilter(remote)
	if err != nil {
		return err
	}
	v6 := strings.HasSuffix(network, "6")
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		if serr = bindChosenPort(int(fd), v6); serr != nil {
			return
		}
		if serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); serr != nil {
			serr = fmt.Errorf("attach the peer filter: %w", serr)
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); serr != nil {
			serr = fmt.Errorf("lock the peer filter: %w", serr)
		}
	})
	return errors.Join(cerr, serr)
}

// skfNetOff is SKF_NET_OFF: classic BPF loads relative to the network
// header, whatever layer the socket's filter runs at.
const skfNetOff = -0x100000

func netOff(k int) uint32 { return uint32(int32(skfNetOff + k)) }

// peerFilter is the classic BPF program admitting only remote's segments:
// IPv4 (the header length read from the packet) or IPv6 (a fixed 40-byte
// header: a segment behind extension headers is dropped, which fails
// closed).
func peerFilter(remote netip.AddrPort) (*unix.SockFprog, error) {
	addr := remote.Addr().Unmap()
	var ins []bpf.Instruction
	var checks [][2]uint32 // offset, value: every word must match
	var portLoad []bpf.Instruction
	if addr.Is4() {
		b := addr.As4()
		checks = append(checks, [2]uint32{netOff(12), binary.BigEndian.Uint32(b[:])})
		portLoad = []bpf.Instruction{
			bpf.LoadMemShift{Off: netOff(0)},
			bpf.LoadIndirect{Off: netOff(0), Size: 2},
		}
	} else {
		b := addr.As16()
		for i := 0; i < 4; i++ {
			checks = append(checks, [2]uint32{netOff(8 + 4*i), binary.BigEndian.Uint32(b[4*i:])})
		}
		portLoad = []bpf.Instruction{bpf.LoadAbsolute{Off: netOff(40), Size: 2}}
	}
	// Each test jumps to the final "drop" when it fails; the distance is
	// counted from the end.
	n := len(checks)*2 + len(portLoad) + 1 + 2 // checks, port load, port test, accept, drop
	pos := 0
	skipToDrop := func() uint8 { return uint8(n - 1 - pos - 1) }
	for _, c := range checks {
		ins = append(ins, bpf.LoadAbsolute{Off: c[0], Size: 4})
		pos++
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpEqual, Val: c[1], SkipFalse: skipToDrop()})
		pos++
	}
	ins = append(ins, portLoad...)
	pos += len(portLoad)
	ins = append(ins, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(remote.Port()), SkipFalse: skipToDrop()})
	ins = append(ins, bpf.RetConstant{Val: 0xffffffff}, bpf.RetConstant{Val: 0})
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("assemble the peer filter: %w", err)
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}, nil
}

// bindChosenPort binds fd to a random port of the kernel's ephemeral range
// (any address), retrying a port in use.
func bindChosenPort(fd int, v6 bool) error {
	lo, hi := ephemeralRange()
	var last error
	for range 64 {
		var b [2]byte
		_, _ = rand.Read(b[:])
		port := lo + int(binary.BigEndian.Uint16(b[:]))%(hi-lo+1)
		var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port}
		if v6 {
			sa = &unix.SockaddrInet6{Port: port}
		}
		last = unix.Bind(fd, sa)
		if !errors.Is(last, unix.EADDRINUSE) {
			break
		}
	}
	if last != nil {
		return fmt.Errorf("bind a local port: %w", last)
	}
	return nil
}

// ephemeralRange reads net.ipv4.ip_local_port_range (it covers IPv6
// too), or Linux's default.
func ephemeralRange() (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 {
			lo, e1 := strconv.Atoi(f[0])
			hi, e2 := strconv.Atoi(f[1])
			if e1 == nil && e2 == nil && 0 < lo && lo <= hi && hi < 65536 {
				return lo, hi
			}
		}
	}
	return 32768, 60999
}
