package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// watchHostAddrs reads the addresses over netlink (RTM_GETADDR) and keeps
// them current: it subscribes to the address change groups before the
// first read, so no change falls between the two, and reads everything
// again after each notification (changes are rare; a full read cannot
// drift, and a lost notification, ENOBUFS, is one more read).
func watchHostAddrs() (HostAddrs, error) {
	sub, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR})
	if err != nil {
		return nil, fmt.Errorf("netlink subscribe: %w", err)
	}
	s, err := dumpHostAddrs()
	if err != nil {
		sub.Close()
		return nil, err
	}
	w := &watchedAddrs{}
	w.cur.Store(s)
	go w.follow(sub)
	return &linuxAddrs{w: w}, nil
}

// fallback is set when the watcher gave up.
var fallback atomic.Pointer[polledAddrs]

// follow re-reads the addresses after each notification on sub, for the
// life of the process (tests that check for leaked goroutines ignore it:
// WatcherFunction).
func (w *watchedAddrs) follow(sub *netlink.Conn) {
	defer sub.Close()
	failures := 0
	for {
		_, err := sub.Receive()
		// ENOBUFS: notifications were lost; the read below covers them.
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			if failures++; failures > 50 {
				// netlink is gone: fall back to reading the interfaces
				// at each check rather than keep a stale set.
				p := &polledAddrs{maxAge: time.Second}
				if s, err := interfaceAddrs(); err == nil {
					p.cur, p.at = s, time.Now()
				}
				fallback.Store(p)
				return
			}
			time.Sleep(100 * time.Millisecond)
		} else {
			failures = 0
		}
		if s, err := dumpHostAddrs(); err == nil {
			w.cur.Store(s)
		}
	}
}

// linuxAddrs answers from the watched set, or from the poller once the
// watcher gave up.
type linuxAddrs struct{ w *watchedAddrs }

func (l *linuxAddrs) Owner(a netip.Addr) (string, bool) {
	if p := fallback.Load(); p != nil {
		return p.Owner(a)
	}
	return l.w.Owner(a)
}

// dumpHostAddrs reads every address of every interface: IFA_LOCAL (the
// local end; IFA_ADDRESS is the peer on point-to-point links) or else
// IFA_ADDRESS. An IPv4 prefix on a loopback interface is local as a
// whole (127.0.0.0/8), so it is recorded as a prefix.
func dumpHostAddrs() (*AddrSet, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETADDR, Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0},
	})
	if err != nil {
		return nil, fmt.Errorf("netlink: list addresses: %w", err)
	}
	s := NewAddrSet()
	names := map[uint32]net.Interface{}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		bits := int(m.Data[1])
		index := binary.NativeEndian.Uint32(m.Data[4:8])
		ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofIfAddrmsg:])
		if err != nil {
			continue
		}
		var local, address netip.Addr
		label := ""
		for ad.Next() {
			switch ad.Type() {
			case unix.IFA_LOCAL:
				local, _ = netip.AddrFromSlice(ad.Bytes())
			case unix.IFA_ADDRESS:
				address, _ = netip.AddrFromSlice(ad.Bytes())
			case unix.IFA_LABEL:
				label = ad.String()
			}
		}
		a := local
		if !a.IsValid() {
			a = address
		}
		if !a.IsValid() {
			continue
		}
		ifc, known := names[index]
		if !known {
			if i, err := net.InterfaceByIndex(int(index)); err == nil {
				ifc = *i
			}
			names[index] = ifc
		}
		if label == "" {
			label = ifc.Name
		}
		s.Add(a, label)
		if a.Is4() && ifc.Flags&net.FlagLoopback != 0 && bits <= 32 {
			s.AddPrefix(netip.PrefixFrom(a, bits), label)
		}
	}
	return s, nil
}
