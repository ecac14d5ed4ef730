package transparent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table the agent owns in the guest: one of
// family ip, and one of family ip6 when IPv6 is captured too (kept apart
// so that a kernel without IPv6 netfilter keeps the IPv4 capture whole).
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
	// CapturePort6 and DNSPort6 are the same on [::1], for Install6.
	CapturePort6 uint16
	DNSPort6     uint16
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

// Install6 is Install for IPv6, after it: the pool's IPv6 range as an
// address of lo, a default route through lo of type local (every IPv6
// destination is this host's, so a connection to one goes through the
// output hook and the redirection, never out; and no kernel turns it into
// a reject route, as some do a plain unicast route through lo), and the
// table TableName of family ip6 with the rules of Install, 127.0.0.0/8
// read ::1 and the ports CapturePort6 and DNSPort6 (a redirection in the
// output hook goes to ::1). On an error the caller removes what was made
// with Uninstall6 and keeps the IPv4 capture.
func Install6(r Rules) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("capture IPv6: %w", err)
	}
	if err := addAddr6(lo.Index, r.Pool.Self6(), r.Pool.Prefix6().Bits()); err != nil {
		return fmt.Errorf("capture IPv6: add %s/%d to lo: %w", r.Pool.Self6(), r.Pool.Prefix6().Bits(), err)
	}
	if err := addLocalDefault6(lo.Index, r.Pool.Self6()); err != nil {
		return fmt.Errorf("capture IPv6: default route through lo: %w", err)
	}
	if err := installTable6(r); err != nil {
		return fmt.Errorf("capture IPv6: nftables (family ip6): %w", err)
	}
	return nil
}

// Uninstall removes the nftables tables (the addresses and routes stay;
// they are harmless without them).
func Uninstall() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	c.AddTable(t)
	c.DelTable(t)
	return errors.Join(c.Flush(), Uninstall6())
}

// Uninstall6 removes the ip6 table when there is one (a kernel without
// IPv6 netfilter has none), in a batch of its own.
func Uninstall6() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyIPv6); err != nil {
		return nil
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: TableName})
	return c.Flush()
}

// UDPDropped returns and resets the count of UDP datagrams dropped
// (IPv4; UDPDropped6 the IPv6 table's).
func UDPDropped() (uint64, error) { return udpDropped(nftables.TableFamilyIPv4) }

// UDPDropped6 is UDPDropped for the ip6 table.
func UDPDropped6() (uint64, error) { return udpDropped(nftables.TableFamilyIPv6) }

func udpDropped(fam nftables.TableFamily) (uint64, error) {
	c, err := nftables.New()
	if err != nil {
		return 0, err
	}
	t := &nftables.Table{Family: fam, Name: TableName}
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
	loopback := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127, 0, 0, 0}},
	}
	return installTableOf(nftables.TableFamilyIPv4, loopback, r.CapturePort, r.DNSPort)
}

func installTable6(r Rules) error {
	// ip6 daddr ::1 (the destination is at offset 24 of the IPv6 header).
	lo := netip.IPv6Loopback().As16()
	loopback := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: lo[:]},
	}
	return installTableOf(nftables.TableFamilyIPv6, loopback, r.CapturePort6, r.DNSPort6)
}

// installTableOf installs the table TableName of family fam: loopback
// matches the family's loopback destinations, which are left alone.
func installTableOf(fam nftables.TableFamily, loopback []expr.Any, capturePort, dnsPort uint16) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: fam, Name: TableName}
	// A table left by an earlier session (an agent restarted in the same
	// namespace) is replaced: add, delete, add. A fresh namespace has
	// none, and the delete is what costs (the kernel waits for an RCU
	// grace period, 5-25 ms measured): it is asked for only when needed.
	if _, err := c.ListTableOfFamily(TableName, fam); err == nil {
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
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_UDP), dport(53), redirect(dnsPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_TCP), dport(53), redirect(dnsPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_TCP), redirect(capturePort))})
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

// addAddr6 adds a/bits to lo without a prefix route (the local default
// route covers the range) and without duplicate address detection.
func addAddr6(ifindex int, a netip.Addr, bits int) error {
	b := a.As16()
	msg := []byte{unix.AF_INET6, byte(bits), unix.IFA_F_NODAD, unix.RT_SCOPE_UNIVERSE}
	msg = binary.NativeEndian.AppendUint32(msg, uint32(ifindex))
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.IFA_LOCAL, b[:])
	ae.Bytes(unix.IFA_ADDRESS, b[:])
	ae.Uint32(unix.IFA_FLAGS, unix.IFA_F_NODAD|unix.IFA_F_NOPREFIXROUTE)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	return rtRequest(unix.RTM_NEWADDR, append(msg, attrs...))
}

// addLocalDefault6 adds "local ::/0 dev lo src src" to the main table.
func addLocalDefault6(ifindex int, src netip.Addr) error {
	b := src.As16()
	return addDefault(unix.AF_INET6, unix.RT_SCOPE_HOST, unix.RTN_LOCAL, ifindex, b[:])
}

func addDefaultRoute(ifindex int, src netip.Addr) error {
	b := src.As4()
	return addDefault(unix.AF_INET, unix.RT_SCOPE_LINK, unix.RTN_UNICAST, ifindex, b[:])
}

// addDefault adds a default route of family, scope and type through
// ifindex with the preferred source src to the main table.
func addDefault(family, scope, typ byte, ifindex int, src []byte) error {
	msg := []byte{family, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_STATIC, scope, typ, 0, 0, 0, 0}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(unix.RTA_OIF, uint32(ifindex))
	ae.Bytes(unix.RTA_PREFSRC, src)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	return rtRequest(unix.RTM_NEWROUTE, append(msg, attrs...))
}

// originalDst returns the destination a redirected connection was made
// to (SO_ORIGINAL_DST, from conntrack; IP6T_SO_ORIGINAL_DST for one
// accepted on an IPv6 socket).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
		return originalDst6(c)
	}
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

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/
// ip6_tables.h; x/sys has only the IPv4 name, SO_ORIGINAL_DST).
const ip6tSOOriginalDst = 80

// originalDst6 reads IP6T_SO_ORIGINAL_DST: a struct sockaddr_in6.
func originalDst6(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var gerr error
	err = rc.Control(func(fd uintptr) {
		// IPv6Mreq is 20 bytes, sockaddr_in6 28: ask for the whole struct.
		var sa [unix.SizeofSockaddrInet6]byte
		l := uint32(len(sa))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IPV6, ip6tSOOriginalDst,
			uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&l)), 0)
		if errno != 0 {
			gerr = errno
			return
		}
		if l < unix.SizeofSockaddrInet6 || binary.NativeEndian.Uint16(sa[0:2]) != unix.AF_INET6 {
			gerr = fmt.Errorf("IP6T_SO_ORIGINAL_DST: unexpected answer of %d bytes", l)
			return
		}
		// family (2), port (big-endian, 2), flowinfo (4), address (16).
		ap = netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), binary.BigEndian.Uint16(sa[2:4]))
	})
	if err == nil {
		err = gerr
	}
	return ap, err
}
