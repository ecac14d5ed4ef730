package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrDescriptor is wrapped by every failure to receive a descriptor on
// the fd channel: none arrived with a frame that carries one, more than
// MaxPendingFDs were pending, or one that is not a stream socket.
var ErrDescriptor = errors.New("fd channel: bad descriptor")

// SendFD writes one frame of type t with body v on c, with the descriptor
// fd attached (SCM_RIGHTS) when fd >= 0, in one sendmsg: the descriptor
// arrives with the frame's bytes, never later. The frame must fit
// MaxHeaderFrame.
func SendFD(c *net.UnixConn, t Type, v any, fd int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", t, err)
	}
	if len(body) > MaxHeaderFrame {
		return fmt.Errorf("write %s: %w: %d bytes, limit %d", t, ErrFrameTooLarge, len(body), MaxHeaderFrame)
	}
	frame := AppendFrame(make([]byte, 0, HeaderSize+len(body)), t, body)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	n, _, err := c.WriteMsgUnix(frame, oob, nil)
	if err != nil {
		return fmt.Errorf("write %s: %w", t, err)
	}
	if n < len(frame) { // the descriptor went with the first part
		if _, err := c.Write(frame[n:]); err != nil {
			return fmt.Errorf("write %s: %w", t, err)
		}
	}
	return nil
}

// FDReader reads frames from one side of the fd channel (the guest's, and
// the host's when it offered CapDataHand) and keeps
// the descriptors that arrive with them, oldest first: the frame that
// carries one (an OK Connected, a Forward) takes it with TakeConn once the
// frame has been read, which is when its descriptor has arrived. It holds
// at most MaxPendingFDs; more is an error (the host sends one per frame
// and the reader takes each before reading on). Read and TakeConn must be
// called from one goroutine; Close from any.
type FDReader struct {
	c    *net.UnixConn
	buf  []byte
	r, w int
	oob  []byte
	mu   sync.Mutex
	fds  []int
	err  error
}

// NewFDReader reads c.
func NewFDReader(c *net.UnixConn) *FDReader {
	return &FDReader{c: c, buf: make([]byte, 2*(HeaderSize+MaxHeaderFrame)), oob: make([]byte, unix.CmsgSpace(4*MaxPendingFDs))}
}

// Read implements io.Reader; descriptors received on the way are kept.
func (f *FDReader) Read(p []byte) (int, error) {
	if f.r == f.w {
		if f.err != nil {
			return 0, f.err
		}
		n, oobn, flags, _, err := f.c.ReadMsgUnix(f.buf, f.oob)
		n, oobn = max(n, 0), max(oobn, 0)
		if oobn > 0 {
			if ferr := f.keep(f.oob[:oobn], flags); ferr != nil {
				f.err = ferr
				return 0, ferr
			}
		}
		if n == 0 && err == nil {
			err = io.EOF
		}
		f.r, f.w = 0, n
		if err != nil && n == 0 {
			return 0, err
		}
		f.err = err
	}
	n := copy(p, f.buf[f.r:f.w])
	f.r += n
	return n, nil
}

// keep parses the control messages of one recvmsg and keeps their
// descriptors (close-on-exec: Go receives with MSG_CMSG_CLOEXEC).
func (f *FDReader) keep(oob []byte, flags int) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	var got []int
	if err == nil {
		for _, m := range msgs {
			fds, perr := unix.ParseUnixRights(&m)
			if perr != nil {
				err = perr
				continue
			}
			got = append(got, fds...)
		}
	}
	f.mu.Lock()
	f.fds = append(f.fds, got...)
	over := len(f.fds) > MaxPendingFDs
	f.mu.Unlock()
	switch {
	case flags&unix.MSG_CTRUNC != 0:
		return fmt.Errorf("%w: more descriptors than %d arrived at once", ErrDescriptor, MaxPendingFDs)
	case err != nil:
		return fmt.Errorf("%w: %v", ErrDescriptor, err)
	case over:
		return fmt.Errorf("%w: more than %d descriptors pending", ErrDescriptor, MaxPendingFDs)
	}
	return nil
}

// TakeConn returns the oldest descriptor received as a connection. It
// must be a connected AF_UNIX stream socket; anything else is closed and
// refused.
func (f *FDReader) TakeConn() (*net.UnixConn, error) {
	fd, file, err := f.take("fd channel connection")
	if err != nil {
		return nil, err
	}
	defer file.Close()
	dom, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err1 != nil || err2 != nil || dom != unix.AF_UNIX || typ != unix.SOCK_STREAM {
		return nil, fmt.Errorf("%w: not an AF_UNIX stream socket", ErrDescriptor)
	}
	c, err := net.FileConn(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDescriptor, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%w: not a unix connection", ErrDescriptor)
	}
	return uc, nil
}

// take removes the oldest received descriptor and wraps it in a file
// named what, which the caller closes.
func (f *FDReader) take(what string) (int, *os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fds) == 0 {
		return -1, nil, fmt.Errorf("%w: the frame's descriptor did not arrive", ErrDescriptor)
	}
	fd := f.fds[0]
	f.fds = f.fds[1:]
	return fd, os.NewFile(uintptr(fd), what), nil
}

// Pending returns how many received descriptors no frame took yet.
func (f *FDReader) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fds)
}

// ErrHandedGone is TakeTCP's answer for a handed TCP socket whose
// connection already ended (its peer reset or closed it): the handing
// Connect fails, and the sender did nothing wrong.
var ErrHandedGone = errors.New("the handed connection ended before it was taken")

// TakeTCP returns the oldest descriptor received as a handed connection
// (Connect.Hand): it must be a TCP socket (AF_INET or AF_INET6,
// SOCK_STREAM, IPPROTO_TCP, not listening), else it is closed and refused
// (ErrDescriptor), and connected, else ErrHandedGone. Nothing about it is trusted but its kind: it is the peer's
// socket in the peer's network namespace, read and written, never
// connected, bound or configured by the reader.
func (f *FDReader) TakeTCP() (*net.TCPConn, error) {
	fd, file, err := f.take("handed connection")
	if err != nil {
		return nil, err
	}
	defer file.Close()
	dom, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	proto, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	lis, err4 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err := errors.Join(err1, err2, err3, err4); err != nil || (dom != unix.AF_INET && dom != unix.AF_INET6) ||
		typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP || lis != 0 {
		return nil, fmt.Errorf("%w: not a connected TCP socket", ErrDescriptor)
	}
	if _, err := unix.Getpeername(fd); err != nil {
		// Its kind is right, its connection is over: the workload's
		// client may reset it at any moment before it is handed, which
		// is no fault of the sender's.
		return nil, ErrHandedGone
	}
	c, err := net.FileConn(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDescriptor, err)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%w: not a TCP connection", ErrDescriptor)
	}
	return tc, nil
}

// SetReadDeadline sets the channel's read deadline (frame bodies are
// bounded by FrameBodyTimeout through it).
func (f *FDReader) SetReadDeadline(t time.Time) error { return f.c.SetReadDeadline(t) }

// Close closes the descriptors no frame took.
func (f *FDReader) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fd := range f.fds {
		_ = unix.Close(fd)
	}
	f.fds = nil
}
