package transparent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family ip) the agent owns in the guest.
const TableName = "oac_egress"

// udpCounter is the named counter of UDP datagrams dropped.
const udpCounter = "udp_dropped"

// Rules describes what capture sets up in the guest's network namespace.
type Rules struct {
	// Pool's range becomes local on lo; its Self is the source address of
	// the default route through lo.
	Pool *Pool
	// CapturePort is the loopback port captured TCP is redirected to.
	CapturePort uint16
	// DNSPort is the loopback port DNS (UDP and TCP port 53 to any
	// address) is redirected to.
	DNSPort uint16
}

// OnlyLoopback reports whether the guest's only interface is lo: capture
// never takes over a namespace that has a real network.
func OnlyLoopback() (bool, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return false, err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 && i.Flags&net.FlagUp != 0 {
			return false, nil
		}
	}
	return true, nil
}

// Install sets up the namespace: the pool's range as an address of lo
// (on lo a prefix is local as a whole), a default route through lo from
// the pool's Self, and the nftables table TableName (replaced if present):
//
//	chain nat_out   (nat, output, dstnat): ip daddr 127.0.0.0/8 return;
//	                udp dport 53 redirect to :DNSPort; tcp dport 53 redirect
//	                to :DNSPort; meta l4proto tcp redirect to :CapturePort
//	chain filter_out (filter, output): ip daddr 127.0.0.0/8 accept;
//	                ct direction reply accept; meta l4proto udp counter
//	                udp_dropped drop
//
// A dropped datagram fails its sendmsg with EPERM at once.
func Install(r Rules) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if err := addAddr(lo.Index, r.Pool.Self(), r.Pool.Prefix().Bits()); err != nil {
		return fmt.Errorf("capture: add %s/%d to lo: %w", r.Pool.Self(), r.Pool.Prefix().Bits(), err)
	}
	if err := addDefaultRoute(lo.Index, r.Pool.Self()); err != nil {
		return fmt.Errorf("capture: default route through lo: %w", err)
	}
	if err := installTable(r); err != nil {
		return fmt.Errorf("capture: nftables: %w (does the kernel have nf_tables, nft_chain_nat and nft_redir?)", err)
	}
	return nil
}

// Uninstall removes the nftables table (the address and route stay; they
// are harmless without it).
func Uninstall() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}

// UDPDropped returns and resets the count of UDP datagrams dropped.
func UDPDropped() (uint64, error) {
	c, err := nftables.New()
	if err != nil {
		return 0, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	o, err := c.ResetObject(&nftables.CounterObj{Table: t, Name: udpCounter})
	if err != nil {
		return 0, err
	}
	if co, ok := o.(*nftables.CounterObj); ok {
		return co.Packets, nil
	}
	if no, ok := o.(*nftables.NamedObj); ok {
		if ce, ok := no.Obj.(*expr.Counter); ok {
			return ce.Packets, nil
		}
	}
	return 0, errors.New("unexpected counter object")
}

func installTable(r Rules) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	// A table left by an earlier session (an agent restarted in the same
	// namespace) is replaced: add, delete, add. A fresh namespace has
	// none, and the delete is what costs (the kernel waits for an RCU
	// grace period, 5-25 ms measured): it is asked for only when needed.
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyIPv4); err == nil {
		c.AddTable(t)
		c.DelTable(t)
	}
	c.AddTable(t)
	nat := c.AddChain(&nftables.Chain{Name: "nat_out", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	accept := nftables.ChainPolicyAccept
	filt := c.AddChain(&nftables.Chain{Name: "filter_out", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	ctr := &nftables.CounterObj{Table: t, Name: udpCounter}
	c.AddObj(ctr)

	loopback := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127, 0, 0, 0}},
	}
	l4 := func(proto byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}
	}
	dport := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		}
	}
	redirect := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
			&expr.Redir{RegisterProtoMin: 1},
		}
	}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(loopback, []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}})})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_UDP), dport(53), redirect(r.DNSPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_TCP), dport(53), redirect(r.DNSPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_TCP), redirect(r.CapturePort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(loopback, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
	// Answers of the guest's own servers to redirected clients (the
	// resolver's replies go to the client's address in the pool's range).
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1 /* IP_CT_DIR_REPLY */}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(l4(unix.IPPROTO_UDP),
		[]expr.Any{&expr.Objref{Type: 1 /* NFT_OBJECT_COUNTER */, Name: udpCounter}, &expr.Verdict{Kind: expr.VerdictDrop}})})
	return c.Flush()
}

// rtnetlink requests, built by hand: two messages do not justify a
// dependency.

func rtRequest(typ netlink.HeaderType, body []byte) error {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: typ, Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Excl},
		Data:   body,
	})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

func addAddr(ifindex int, a netip.Addr, bits int) error {
	b := a.As4()
	msg := []byte{unix.AF_INET, byte(bits), 0, unix.RT_SCOPE_UNIVERSE}
	msg = binary.NativeEndian.AppendUint32(msg, uint32(ifindex))
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.IFA_LOCAL, b[:])
	ae.Bytes(unix.IFA_ADDRESS, b[:])
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	return rtRequest(unix.RTM_NEWADDR, append(msg, attrs...))
}

func addDefaultRoute(ifindex int, src netip.Addr) error {
	b := src.As4()
	msg := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_STATIC, unix.RT_SCOPE_LINK, unix.RTN_UNICAST, 0, 0, 0, 0}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(unix.RTA_OIF, uint32(ifindex))
	ae.Bytes(unix.RTA_PREFSRC, b[:])
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	return rtRequest(unix.RTM_NEWROUTE, append(msg, attrs...))
}

// originalDst returns the destination a redirected connection was made
// to (SO_ORIGINAL_DST, from conntrack).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var gerr error
	err = rc.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			gerr = err
			return
		}
		// A sockaddr_in: family (2 bytes), port (big-endian), address.
		port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	})
	if err == nil {
		err = gerr
	}
	return ap, err
}
