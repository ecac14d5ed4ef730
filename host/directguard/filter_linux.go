package directguard

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// skfNetOff is SKF_NET_OFF: classic BPF loads relative to the network
// header, whatever layer the socket's filter runs at.
const skfNetOff = -0x100000

func netOff(k int) uint32 { return uint32(int32(skfNetOff + k)) }

// peerFilter is the classic BPF program admitting only remote's segments:
// IPv4 (the header length read from the packet) or IPv6 (a fixed 40-byte
// header: a segment behind extension headers is dropped, which fails
// closed). A v4-mapped remote is matched as the IPv4 packets it sends.
func peerFilter(remote netip.AddrPort) (*unix.SockFprog, error) {
	addr := remote.Addr().Unmap()
	if !addr.IsValid() {
		return nil, fmt.Errorf("peer filter: %v is not an address", remote)
	}
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
		for i := range 4 {
			checks = append(checks, [2]uint32{netOff(8 + 4*i), binary.BigEndian.Uint32(b[4*i:])})
		}
		portLoad = []bpf.Instruction{bpf.LoadAbsolute{Off: netOff(40), Size: 2}}
	}
	// Each test jumps to the final "drop" when it fails; the distance is
	// counted from the end.
	n := len(checks)*2 + len(portLoad) + 1 + 2 // checks, port load, port test, accept, drop
	pos := 0
	skipToDrop := func() uint8 { return uint8(n - 1 - pos - 1) }
	var ins []bpf.Instruction
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
