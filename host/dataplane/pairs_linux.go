package dataplane

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// pairsAhead is how many pairs the maker keeps ready: a Connect does not
// wait for the maker's thread, which wakes once the supply has fallen to
// half and then makes the other half at once (waking it for every pair
// cost each connect 40-50 µs measured, on 2 cores).
const pairsAhead = 8

// pairMaker makes socketpairs in the guest's network namespace: a socket
// belongs to the namespace of the thread that creates it, and one thread
// of this process joins the guest's (found from the channel's own socket,
// which the kernel made in the namespace the guest dialed from) and never
// leaves it. So the guest's end is a socket of its own namespace, never
// one of the host's (whose ioctls would show the host's interfaces, and
// whose bind would claim names in the host's abstract socket namespace).
type pairMaker struct {
	ready chan [2]int
	need  chan struct{}
	quit  chan struct{}
	once  sync.Once
	done  chan struct{}
}

func newPairMaker(c *net.UnixConn) (*pairMaker, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	nsfd := -1
	var ierr error
	if err := rc.Control(func(fd uintptr) { nsfd, ierr = unix.IoctlRetInt(int(fd), unix.SIOCGSKNS) }); err != nil {
		return nil, err
	}
	if ierr != nil {
		return nil, fmt.Errorf("find the guest's network namespace (SIOCGSKNS): %w", ierr)
	}
	pm := &pairMaker{ready: make(chan [2]int, pairsAhead), need: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	started := make(chan error, 1)
	go pm.run(nsfd, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return pm, nil
}

// run is the maker's thread: it joins the namespace and makes pairs until
// stopped, then goes back to the shim's namespace and gives the thread
// back. The thread must not end: a child another goroutine started from
// it earlier with a parent-death signal (the runtime of a sandbox: docker,
// qemu, bwrap) gets that signal when the thread that forked it exits, not
// when the process does. Only when the way back fails is the thread left
// locked, so that it ends instead of serving other goroutines from the
// guest's namespace.
func (pm *pairMaker) run(nsfd int, started chan<- error) {
	defer close(pm.done)
	runtime.LockOSThread()
	home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(nsfd)
		runtime.UnlockOSThread()
		started <- fmt.Errorf("open the shim's own network namespace: %w", err)
		return
	}
	defer func() {
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		_ = unix.Close(home)
	}()
	err = unix.Setns(nsfd, unix.CLONE_NEWNET)
	_ = unix.Close(nsfd)
	if err != nil {
		started <- fmt.Errorf("join the guest's network namespace (needs CAP_SYS_ADMIN: a root shim): %w", err)
		return
	}
	started <- nil
	for {
		for len(pm.ready) < cap(pm.ready) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			p := [2]int{fds[0], fds[1]}
			if err != nil {
				// Out of descriptors: say so to the one who asks, and try
				// again when asked.
				p = [2]int{-1, int(err.(unix.Errno))}
			}
			select {
			case pm.ready <- p:
			case <-pm.quit:
				if err == nil {
					_ = unix.Close(fds[0])
					_ = unix.Close(fds[1])
				}
				return
			}
			if err != nil {
				break
			}
		}
		select {
		case <-pm.need:
		case <-pm.quit:
			return
		}
	}
}

var errStopped = errors.New("the channel is closed")

// get returns a ready pair: [0] the host's end, [1] the guest's.
func (pm *pairMaker) get() ([2]int, error) {
	defer func() {
		if len(pm.ready) <= cap(pm.ready)/2 {
			select {
			case pm.need <- struct{}{}:
			default:
			}
		}
	}()
	select {
	case p, ok := <-pm.ready:
		if !ok {
			return p, errStopped
		}
		if p[0] < 0 {
			return p, fmt.Errorf("socketpair: %w", unix.Errno(p[1]))
		}
		return p, nil
	case <-pm.quit:
		return [2]int{}, errStopped
	}
}

// stop ends the thread and closes the pairs made ahead.
func (pm *pairMaker) stop() {
	pm.once.Do(func() {
		close(pm.quit)
		<-pm.done
		for {
			select {
			case p := <-pm.ready:
				if p[0] >= 0 {
					_ = unix.Close(p[0])
					_ = unix.Close(p[1])
				}
			default:
				return
			}
		}
	})
}

func closeFD(fd int) error { return unix.Close(fd) }

// CanMakePairs reports whether this process can make an fd channel's
// pairs: it makes them in the guest's network namespace, which takes
// CAP_SYS_ADMIN (a root shim). A shim without it offers the fd channel
// for handed sockets only (protocol.CapDataHand without
// protocol.CapDataFD) beside dialed data connections.
func CanMakePairs() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0
}

// CanTakeHanded reports whether this process can run an fd channel that
// takes handed sockets: receiving a descriptor needs no privilege, so on
// Linux it always can.
func CanTakeHanded() bool { return true }

// peersGone reports whether the guest's side of a failed connection went
// away (its peer closed or reset it: the guest's client died and the guest
// closed its end) while the upstream is still there, looking at both
// sockets without taking a byte (a carrier with no abort message of its
// own). A half-close is not a failure, so Carry asks only after one.
func peersGone(guest, up net.Conn) bool {
	return peerGone(guest) && !peerGone(up)
}

// peerGone peeks at c: end of stream or an error other than "nothing yet"
// means its peer is gone.
func peerGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		gone = (err == nil && n == 0) || (err != nil && err != unix.EAGAIN && err != unix.EINTR)
	})
	return gone
}
