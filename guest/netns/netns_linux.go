package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/initsys"
)

// threadNS is the network namespace of the calling thread.
const threadNS = "/proc/thread-self/ns/net"

// NS is a network namespace the agent works in without entering it. A nil
// *NS is the agent's own: its methods act in place.
type NS struct {
	f *os.File
}

// Others returns the interfaces of the agent's own namespace other than
// loopback ones, up or down.
func Others() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 {
			out = append(out, i.Name)
		}
	}
	return out, nil
}

// New makes a network namespace with only lo, up.
func New() (*NS, error) {
	type result struct {
		ns  *NS
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(threadNS)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("workload network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			if errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w (the agent needs CAP_SYS_ADMIN)", err)
			}
			ch <- result{err: fmt.Errorf("workload network namespace: unshare: %w", err)}
			return
		}
		f, err := os.Open(threadNS)
		if err == nil {
			_, err = initsys.LoopbackUp()
		}
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			if f != nil {
				f.Close()
			}
			ch <- result{err: fmt.Errorf("workload network namespace: %w", err)}
			return
		}
		ch <- result{ns: &NS{f: f}}
	}()
	r := <-ch
	return r.ns, r.err
}

// File is the namespace's handle for setns(2); nil for the agent's own.
func (n *NS) File() *os.File {
	if n == nil {
		return nil
	}
	return n.f
}

// Do runs fn on an OS thread in the namespace (in place for the agent's
// own) and returns its error.
func (n *NS) Do(fn func() error) error {
	if n == nil {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(threadNS)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("workload network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter the workload network namespace: %w", err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		// else: the goroutine ends locked; the runtime destroys the
		// thread rather than run other code in the wrong namespace.
		errc <- err
	}()
	return <-errc
}

// Listen is net.Listen in the namespace.
func (n *NS) Listen(network, address string) (ln net.Listener, err error) {
	err = n.Do(func() error {
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// ListenPacket is net.ListenPacket in the namespace.
func (n *NS) ListenPacket(network, address string) (pc net.PacketConn, err error) {
	err = n.Do(func() error {
		pc, err = net.ListenPacket(network, address)
		return err
	})
	return pc, err
}

// DialContext dials from the namespace (the socket is made there; the
// connection is then used from any thread).
func (n *NS) DialContext(ctx context.Context, network, address string) (c net.Conn, err error) {
	err = n.Do(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Close releases the agent's handle; the namespace lives on while a
// process or socket is in it.
func (n *NS) Close() error {
	if n == nil {
		return nil
	}
	return n.f.Close()
}

// Open returns the network namespace at path (an nsfs file: a process's
// /proc/PID/ns/net, or a bind mount of one such as /run/netns/NAME).
func Open(path string) (*NS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("open network namespace: %s is not a namespace file", path)
	}
	return &NS{f: f}, nil
}
