package transport

import (
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// streamConn adapts a reader and a writer (pipes, a serial device, stdio)
// to net.Conn. Deadlines are passed on where the underlying files support
// them and otherwise ignored.
type streamConn struct {
	r    io.ReadCloser
	w    io.WriteCloser
	name string
	once sync.Once
	cerr error
}

type addr string

func (a addr) Network() string { return "stream" }
func (a addr) String() string  { return string(a) }

// StreamConn returns a net.Conn that reads from r and writes to w; Close
// closes both. It carries a session over process pipes (stdio transports).
func StreamConn(r io.ReadCloser, w io.WriteCloser, name string) net.Conn {
	return &streamConn{r: r, w: w, name: name}
}

// Stdio returns a net.Conn over this process's stdin and stdout. It makes
// the process ignore SIGPIPE: Go kills a program that writes to a broken
// pipe on stdout, so a host that closes its end first (it does, once it
// has the guest's last message) would kill a guest still writing its
// farewell; with SIGPIPE ignored the write fails with EPIPE instead.
func Stdio() net.Conn {
	signal.Ignore(syscall.SIGPIPE)
	return StreamConn(os.Stdin, os.Stdout, "stdio")
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *streamConn) Close() error {
	c.once.Do(func() {
		err1 := c.r.Close()
		var err2 error
		if any(c.w) != any(c.r) {
			err2 = c.w.Close()
		}
		c.cerr = errors.Join(err1, err2)
	})
	return c.cerr
}
func (c *streamConn) LocalAddr() net.Addr  { return addr(c.name) }
func (c *streamConn) RemoteAddr() net.Addr { return addr(c.name) }

type readDeadliner interface{ SetReadDeadline(time.Time) error }
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

func (c *streamConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}
func (c *streamConn) SetReadDeadline(t time.Time) error {
	if d, ok := c.r.(readDeadliner); ok {
		if err := d.SetReadDeadline(t); err != nil && !errors.Is(err, os.ErrNoDeadline) {
			return err
		}
	}
	return nil
}
func (c *streamConn) SetWriteDeadline(t time.Time) error {
	if d, ok := c.w.(writeDeadliner); ok {
		if err := d.SetWriteDeadline(t); err != nil && !errors.Is(err, os.ErrNoDeadline) {
			return err
		}
	}
	return nil
}
