package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// rootDirect is --mode rootdirect: guest root asking for a socket of the
// host's own network namespace on the fd channel (a direct Connect),
// whether or not the host offered direct mode, and attacking the socket
// it gets with what root in the host's user namespace could do with it.
// Its parameters are the bootstrap daemon's argv (key=value):
//
//	upstream=NAME:PORT  the allowed upstream to ask for
//	service=ADDR:PORT   a service on the host's loopback no rule allows
//	route=ADDR          a destination whose /32 route SIOCADDRT tries to add
//
// Each outcome is a log line "attack: key=value" (stream daemon/stdout),
// then "attack: done=1"; it stops in order on Shutdown.
func rootDirect(sess *yamux.Session, ctl *protocol.Control, welcome protocol.Welcome, boot protocol.Frame, ready func(string)) {
	logs, err := protocol.OpenStream(sess, protocol.StreamHeader{Kind: protocol.KindLog, Name: "daemon/stdout"})
	if err != nil {
		fail(err)
	}
	say := func(k string, v any) { fmt.Fprintf(logs, "attack: %s=%v\n", k, v) }
	params := map[string]string{}
	var b bootstrap.Bootstrap
	if err := boot.Decode(&b); err == nil && b.Daemon != nil {
		for _, a := range b.Daemon.Argv {
			if k, v, ok := strings.Cut(a, "="); ok {
				params[k] = v
			}
		}
	}
	say("offered", strings.Join(welcome.Capabilities, ","))
	ready("")
	go func() {
		defer say("done", 1)
		fd, ok := askDirect(say, welcome, params["upstream"])
		if !ok {
			return
		}
		attackAsRoot(say, fd, params)
	}()
	for {
		f, err := ctl.Recv()
		if err != nil {
			fmt.Fprintln(os.Stderr, "badguest: control stream ended:", err)
			os.Exit(1)
		}
		if f.Type == protocol.TypeShutdown {
			_ = ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped})
			time.Sleep(time.Second)
			os.Exit(0)
		}
	}
}

// askDirect dials the fd channel and sends a direct Connect for upstream,
// offered or not; it returns the descriptor of the socket the host
// answered with.
func askDirect(say func(string, any), welcome protocol.Welcome, upstream string) (int, bool) {
	host, portS, err := net.SplitHostPort(upstream)
	port, _ := strconv.Atoi(portS)
	if err != nil || port == 0 {
		say("direct", "no upstream parameter")
		return -1, false
	}
	if welcome.DataToken == "" {
		say("channel", "not offered")
		return -1, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), protocol.DataChannelTimeout)
	defer cancel()
	conn, err := endpoint.Dial(ctx)
	if err != nil {
		say("channel", "dial: "+err.Error())
		return -1, false
	}
	uc := conn.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(protocol.DataChannelTimeout))
	if err := protocol.WriteMessage(uc, protocol.TypeChannel, protocol.Channel{Token: welcome.DataToken}); err != nil {
		say("channel", err.Error())
		return -1, false
	}
	var ack protocol.Channel
	if err := protocol.ReadMessage(uc, protocol.MaxHeaderFrame, protocol.TypeChannel, &ack); err != nil {
		say("channel", "not taken: "+err.Error())
		return -1, false
	}
	say("channel", "up")
	_ = uc.SetDeadline(time.Now().Add(30 * time.Second))
	req := protocol.Connect{ID: 1, Host: host, Port: port, Via: protocol.ViaDirect, Direct: true}
	if err := protocol.WriteMessage(uc, protocol.TypeConnect, req); err != nil {
		say("direct", "send: "+err.Error())
		return -1, false
	}
	r := protocol.NewFDReader(uc)
	f, err := protocol.ReadFrame(r, protocol.MaxHeaderFrame)
	if err != nil {
		if errors.Is(err, io.EOF) {
			say("direct", "channel closed by the host")
		} else {
			say("direct", "no answer: "+err.Error())
		}
		return -1, false
	}
	var ans protocol.Connected
	if f.Type != protocol.TypeConnected || f.Decode(&ans) != nil {
		say("direct", "answer "+f.Type.String())
		return -1, false
	}
	if !ans.OK() {
		say("direct", "refused "+ans.Error)
		return -1, false
	}
	c, err := r.TakeTCP()
	if err != nil {
		say("direct", "answered without a socket: "+err.Error())
		return -1, false
	}
	file, err := c.File()
	c.Close()
	if err != nil {
		say("direct", "handed but unusable: "+err.Error())
		return -1, false
	}
	fd := int(file.Fd())
	_ = unix.SetNonblock(fd, false)
	say("direct", "handed")
	say("direct-local", addrOf(unix.Getsockname(fd)))
	say("direct-peer", addrOf(unix.Getpeername(fd)))
	go func() { runtime.KeepAlive(file); select {} }()
	return fd, true
}

func addrOf(sa unix.Sockaddr, err error) string {
	if err != nil {
		return errName(err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// attackAsRoot does, as guest root, what the class 5 did with a
// handed socket, then what would take it elsewhere.
func attackAsRoot(say func(string, any), fd int, params map[string]string) {
	// What a socket shows of its namespace: needs no capability, and root
	// in the guest is not refused it (the documented residual).
	buf := ifconfBuf[:]
	conf := struct {
		len int32
		_   int32
		buf uintptr
	}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf))); e != 0 {
		say("root-SIOCGIFCONF", errName(e))
	} else {
		var names []string
		for off := 0; off+40 <= int(conf.len); off += 40 {
			names = append(names, strings.TrimRight(string(buf[off:off+16]), "\x00"))
		}
		say("root-SIOCGIFCONF", "ok:"+strings.Join(names, ","))
	}
	// The host's network namespace as a descriptor.
	if r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGSKNS, 0); e != 0 {
		say("root-SIOCGSKNS", errName(e))
	} else {
		unix.Close(int(r))
		say("root-SIOCGSKNS", "ok")
	}
	// A route in the host's table.
	if dst, err := netip.ParseAddr(params["route"]); err == nil && dst.Is4() {
		say("root-SIOCADDRT", errName(addRoute(fd, dst)))
	}
	say("root-TCP_REPAIR", errName(unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1)))
	say("root-SO_MARK", errName(unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 0x77)))
	say("root-SO_BINDTODEVICE", errName(unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo")))
	say("root-IP_OPTIONS", errName(unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, "\x01\x01\x01\x00")))
	// Elsewhere: a disconnect, then a service of the host's loopback
	// (non-blocking: EINPROGRESS means its SYN left).
	var unspec [16]byte
	say("root-disconnect", errName(rawConnect(fd, unspec)))
	if svc, err := netip.ParseAddrPort(params["service"]); err == nil {
		_ = unix.SetNonblock(fd, true)
		say("root-connect-service", errName(rawConnect(fd, sockaddr4(svc))))
		_ = unix.SetNonblock(fd, false)
	}
	say("root-bind", errName(unix.Bind(fd, &unix.SockaddrInet4{})))
	say("root-listen", errName(unix.Listen(fd, 1)))
	say("root-local-after", addrOf(unix.Getsockname(fd)))
}

func sockaddr4(ap netip.AddrPort) [16]byte {
	var b [16]byte
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As4()
	copy(b[4:], a[:])
	return b
}

func rawConnect(fd int, sa [16]byte) error {
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), 16); e != 0 {
		return e
	}
	return nil
}

// addRoute is SIOCADDRT for dst/32 on lo (struct rtentry).
func addRoute(fd int, dst netip.Addr) error {
	type rtentry struct {
		pad1    uint64
		dst     [16]byte
		gateway [16]byte
		genmask [16]byte
		flags   uint16
		pad2    int16
		pad3    uint64
		tos     uint8
		class   uint8
		pad4    [3]int16
		metric  int16
		dev     uintptr
		mtu     uint64
		window  uint64
		irtt    uint16
	}
	dev := loName[:]
	rt := rtentry{dst: sockaddr4(netip.AddrPortFrom(dst, 0)), flags: unix.RTF_UP | unix.RTF_HOST, dev: uintptr(unsafe.Pointer(&dev[0]))}
	mask := sockaddr4(netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 0))
	rt.genmask = mask
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt)))
	if e != 0 {
		return e
	}
	return nil
}

// Buffers the kernel reads or writes through a pointer inside an
// argument: not on a goroutine's stack, which may move.
var (
	ifconfBuf [40 * 64]byte
	loName    = [3]byte{'l', 'o', 0}
)

// endpoint is the agent's transport (the fd channel dials it again).
var endpoint transport.Endpoint
