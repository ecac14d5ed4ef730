//go:build linux

package netreach

import "golang.org/x/sys/unix"

// Sockopt is one setsockopt level and name.
type Sockopt struct {
	Level, Name uint32
	// What names it in messages and docs.
	What string
}

// Sockopts are refused on a socket that may be the host's. Each needs no
// capability (the kernel would refuse the privileged ones, such as SO_MARK
// and TCP_REPAIR, by itself: the guest has no capability in the host's
// namespace).
var Sockopts = []Sockopt{
	// Binds the socket to one of its namespace's interfaces, by name or
	// index (no capability since Linux 5.7 when it was not bound yet).
	{unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "SO_BINDTODEVICE"},
	{unix.SOL_SOCKET, unix.SO_BINDTOIFINDEX, "SO_BINDTOIFINDEX"},
	// Source routing: segments go to the route's first hop, not the
	// peer, once the cached route is looked up again.
	{unix.IPPROTO_IP, unix.IP_OPTIONS, "IP_OPTIONS"},
	{unix.IPPROTO_IPV6, unix.IPV6_RTHDR, "IPV6_RTHDR"},
	{unix.IPPROTO_IPV6, unix.IPV6_2292RTHDR, "IPV6_2292RTHDR"},
	{unix.IPPROTO_IPV6, unix.IPV6_2292PKTOPTIONS, "IPV6_2292PKTOPTIONS"},
	// Chooses an outgoing interface.
	{unix.IPPROTO_IP, unix.IP_UNICAST_IF, "IP_UNICAST_IF"},
	{unix.IPPROTO_IPV6, unix.IPV6_UNICAST_IF, "IPV6_UNICAST_IF"},
}

// IoctlRange is an inclusive range of ioctl request numbers.
type IoctlRange struct {
	First, Last uint32
	What        string
}

// Ioctls are the socket ioctls answered for the socket's namespace rather
// than the socket: routes (SIOCADDRT 0x890B on), interfaces, addresses and
// their MACs (SIOCGIFCONF, SIOCGIFHWADDR), ARP, the namespace itself
// (SIOCGSKNS 0x894C), bridges, bonding, VLANs, devices' private requests
// (to 0x89FF) and wireless extensions (0x8B00 to 0x8BFF). Many need no
// capability to read. What a socket itself answers stays open: FIONREAD,
// TIOCOUTQ, SIOCATMARK, the timestamps and owners (0x8901 to 0x8907) and
// SIOCOUTQNSD (0x894B).
var Ioctls = []IoctlRange{
	{0x8908, unix.SIOCOUTQNSD - 1, "routes, interfaces, addresses, ARP"},
	{unix.SIOCOUTQNSD + 1, 0x8BFF, "the namespace, bridges, bonding, VLANs, devices, wireless"},
}

// SocketcallSetsockopt is i386 socketcall's number for setsockopt
// (linux/net.h): its arguments hide behind a pointer no filter reads.
const SocketcallSetsockopt = 14
