package directguard

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/netreach"
)

// sealValue is a sealed socket's entry in the socket-storage map: the peer
// it was sealed with, as its packets carry it.
type sealValue struct {
	// Version is the IP version of the packets the socket sends (4 for
	// an IPv6 socket connected to a v4-mapped address).
	Version uint32
	// Addr is the peer's address; an IPv4 one fills the first 4 bytes.
	Addr [16]byte
}

func sealValueFor(peer netip.Addr) sealValue {
	var v sealValue
	if a := peer.Unmap(); a.Is4() {
		b := a.As4()
		v.Version = 4
		copy(v.Addr[:], b[:])
	} else {
		v.Version = 6
		v.Addr = a.As16()
	}
	return v
}

// Offsets into the programs' contexts (include/uapi/linux/bpf.h).
const (
	sockAddrSk  = 64  // struct bpf_sock_addr, sk
	sockoptSk   = 0   // struct bpf_sockopt, sk
	sockoptLvl  = 24  // struct bpf_sockopt, level
	sockoptName = 28  // struct bpf_sockopt, optname
	skbSk       = 168 // struct __sk_buff, sk
	sockBoundIf = 0   // struct bpf_sock, bound_dev_if
)

// extraSockopts are refused on a sealed socket besides netreach.Sockopts:
// IP_LOCAL_PORT_RANGE, so that a disconnected socket made to listen
// (which picks its port by itself) stays inside the port share.
var extraSockopts = []netreach.Sockopt{
	{Level: unix.IPPROTO_IP, Name: unix.IP_LOCAL_PORT_RANGE, What: "IP_LOCAL_PORT_RANGE"},
}

func refusedSockopts() []netreach.Sockopt {
	return append(append([]netreach.Sockopt(nil), netreach.Sockopts...), extraSockopts...)
}

// newSealMap is the socket-storage map marking sealed sockets. It clones
// into a child socket accepted from a sealed one (BPF_F_CLONE), so a
// sealed socket made to listen hands out only sealed ones.
func newSealMap() (*ebpf.Map, error) {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u8 := &btf.Int{Name: "unsigned char", Size: 1}
	return ebpf.NewMap(&ebpf.MapSpec{
		Name:      "oac_direct",
		Type:      ebpf.SkStorage,
		KeySize:   4,
		ValueSize: 20,
		Flags:     unix.BPF_F_NO_PREALLOC | unix.BPF_F_CLONE,
		// Socket storage needs BTF for its key and value.
		Key: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
		Value: &btf.Struct{Name: "oac_seal", Size: 20, Members: []btf.Member{
			{Name: "version", Type: u32, Offset: 0},
			{Name: "addr", Type: &btf.Array{Index: u32, Type: u8, Nelems: 16}, Offset: 32},
		}},
	})
}

// storageGet is r0 = bpf_sk_storage_get(m, sk in r2, NULL, 0): the seal
// or NULL.
func storageGet(m *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkStorageGet.Call(),
	}
}

// allowOrRefuse ends a program: 1 (allow) at label "allow", 0 (refuse:
// EPERM, or drop) at label "refuse".
var allowOrRefuse = asm.Instructions{
	asm.Mov.Imm(asm.R0, 0).WithSymbol("refuse"),
	asm.Return(),
	asm.Mov.Imm(asm.R0, 1).WithSymbol("allow"),
	asm.Return(),
}

// sockAddrProgram refuses connect or bind on a sealed socket.
func sockAddrProgram(m *ebpf.Map) asm.Instructions {
	ins := asm.Instructions{asm.LoadMem(asm.R2, asm.R1, sockAddrSk, asm.DWord)}
	ins = append(ins, storageGet(m)...)
	ins = append(ins, asm.JEq.Imm(asm.R0, 0, "allow"), asm.Ja.Label("refuse"))
	return append(ins, allowOrRefuse...)
}

// sockoptProgram refuses the listed setsockopt options on a sealed socket.
func sockoptProgram(m *ebpf.Map, refused []netreach.Sockopt) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, sockoptSk, asm.DWord),
	}
	ins = append(ins, storageGet(m)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, 0, "allow"),
		asm.LoadMem(asm.R7, asm.R6, sockoptLvl, asm.Word),
		asm.LoadMem(asm.R8, asm.R6, sockoptName, asm.Word),
	)
	// Option i's test starts at "opt<i>"; the last one's miss is "allow".
	label := func(i int) string {
		if i == len(refused) {
			return "allow"
		}
		return fmt.Sprintf("opt%d", i)
	}
	for i, o := range refused {
		ins = append(ins,
			asm.JNE.Imm32(asm.R7, int32(o.Level), label(i+1)).WithSymbol(label(i)),
			asm.JEq.Imm32(asm.R8, int32(o.Name), "refuse"),
		)
	}
	ins = append(ins, asm.Ja.Label("allow"))
	return append(ins, allowOrRefuse...)
}

// egressProgram drops a sealed socket's packet when the socket is bound
// to a device, or the packet is not addressed to the peer it was sealed
// with (a source route sends it to the route's first hop). It holds
// whatever set those: a compat (32-bit) setsockopt never runs the cgroup
// setsockopt program.
func egressProgram(m *ebpf.Map) asm.Instructions {
	const hdr = -40 // the packet's first 40 bytes, on the stack
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, skbSk, asm.DWord),
		asm.JEq.Imm(asm.R1, 0, "allow"),
		asm.FnSkFullsock.Call(),
		asm.JEq.Imm(asm.R0, 0, "allow"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Reg(asm.R2, asm.R0),
	}
	ins = append(ins, storageGet(m)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, 0, "allow"),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.LoadMem(asm.R1, asm.R7, sockBoundIf, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "refuse"),
		// Every TCP segment has 40 bytes: an IPv4 and a TCP header at
		// least, or an IPv6 header.
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, hdr),
		asm.Mov.Imm(asm.R4, 40),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "refuse"),
		asm.LoadMem(asm.R1, asm.R10, hdr, asm.Byte),
		asm.RSh.Imm(asm.R1, 4),
		asm.LoadMem(asm.R2, asm.R8, 0, asm.Word), // Version
		asm.JNE.Reg(asm.R1, asm.R2, "refuse"),
		asm.JEq.Imm(asm.R1, 6, "v6"),
		// IPv4: the destination at 16.
		asm.LoadMem(asm.R1, asm.R10, hdr+16, asm.Word),
		asm.LoadMem(asm.R2, asm.R8, 4, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "refuse"),
		asm.Ja.Label("allow"),
	)
	// IPv6: the destination at 24.
	for i := range 4 {
		ld := asm.LoadMem(asm.R1, asm.R10, int16(hdr+24+4*i), asm.Word)
		if i == 0 {
			ld = ld.WithSymbol("v6")
		}
		ins = append(ins, ld,
			asm.LoadMem(asm.R2, asm.R8, int16(4+4*i), asm.Word),
			asm.JNE.Reg(asm.R1, asm.R2, "refuse"),
		)
	}
	ins = append(ins, asm.Ja.Label("allow"))
	return append(ins, allowOrRefuse...)
}

// program is one of the guard's programs and where it attaches.
type program struct {
	name   string
	typ    ebpf.ProgramType
	attach ebpf.AttachType
	ins    asm.Instructions
}

func programs(m *ebpf.Map) []program {
	sa := sockAddrProgram(m)
	return []program{
		{"oac_connect4", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet4Connect, sa},
		{"oac_connect6", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet6Connect, sa},
		{"oac_bind4", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet4Bind, sa},
		{"oac_bind6", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet6Bind, sa},
		{"oac_sockopt", ebpf.CGroupSockopt, ebpf.AttachCGroupSetsockopt, sockoptProgram(m, refusedSockopts())},
		{"oac_egress", ebpf.CGroupSKB, ebpf.AttachCGroupInetEgress, egressProgram(m)},
	}
}

func loadProgram(p program) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         p.name,
		Type:         p.typ,
		AttachType:   p.attach,
		Instructions: p.ins,
		License:      "GPL", // socket storage's helpers are GPL-only
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("direct mode cannot be guarded: the kernel refused the guard's %s program (it needs Linux 6.3 or later): %w", p.name, err)
		}
		return nil, fmt.Errorf("direct mode cannot be guarded: loading the guard's %s program failed (it needs Linux 6.3 or later, and root): %w", p.name, err)
	}
	return prog, nil
}
