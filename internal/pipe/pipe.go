package pipe

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Buffer sizes, the release delay, and how many big buffers the copy
// loops of a process may hold at once: beyond MaxBigBuffers (8 MiB) a busy
// loop keeps its small buffer, so a guest that makes many connections
// carry bulk data (or read none of it) costs at most that much in big
// buffers (docs/threat-model.md, the shim's memory ceiling).
const (
	SmallBuffer   = 8 << 10
	BigBuffer     = 256 << 10
	ReleaseAfter  = time.Second
	MaxBigBuffers = 32
)

var (
	bigPool  = sync.Pool{New: func() any { b := make([]byte, BigBuffer); return &b }}
	bigInUse atomic.Int64
)

// BigBuffersInUse returns how many large buffers copy loops hold now.
func BigBuffersInUse() int64 { return bigInUse.Load() }

// getBig returns a big buffer, or nil when MaxBigBuffers are in use.
func getBig() *[]byte {
	if bigInUse.Add(1) > MaxBigBuffers {
		bigInUse.Add(-1)
		return nil
	}
	return bigPool.Get().(*[]byte)
}

func putBig(b *[]byte) {
	bigInUse.Add(-1)
	bigPool.Put(b)
}

// Activity records when bytes last moved; the zero value is ready to use
// and counts as active since its first Touch. A spliced Join, whose bytes
// never pass through a loop that could Touch it, asks the kernel instead
// (probe: how long ago its TCP socket last sent or received data).
type Activity struct {
	last  atomic.Int64
	probe atomic.Pointer[func() (time.Duration, bool)]
}

// Touch records activity now.
func (a *Activity) Touch() {
	if a != nil {
		a.last.Store(time.Now().UnixNano())
	}
}

// Idle returns how long ago bytes last moved (0 before the first Touch).
func (a *Activity) Idle() time.Duration {
	l := a.last.Load()
	if l == 0 {
		return 0
	}
	idle := time.Since(time.Unix(0, l))
	if p := a.probe.Load(); p != nil {
		if d, ok := (*p)(); ok && d < idle {
			idle = d
		}
	}
	return idle
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }

// shrinker is implemented by yamux streams: it frees the receive buffer.
type shrinker interface{ Shrink() }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Copy copies src to dst until src ends (io.EOF returns a nil error) or an
// error occurs, and returns the number of bytes written to dst.
func Copy(dst io.Writer, src io.Reader, act *Activity) (int64, error) {
	small := make([]byte, SmallBuffer)
	var big *[]byte
	dl, canDeadline := src.(readDeadliner)
	defer func() {
		if big != nil {
			putBig(big)
			if canDeadline {
				_ = dl.SetReadDeadline(time.Time{})
			}
		}
	}()
	var total int64
	for {
		buf := small
		if big != nil {
			buf = *big
			if canDeadline {
				_ = dl.SetReadDeadline(time.Now().Add(ReleaseAfter))
			}
		}
		n, rerr := src.Read(buf)
		if n > 0 {
			act.Touch()
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, werr
			}
			if w != n {
				return total, io.ErrShortWrite
			}
		}
		if rerr != nil {
			if big != nil && canDeadline && isTimeout(rerr) {
				// Idle for ReleaseAfter: give the big buffer back and wait
				// on the small one without a deadline.
				putBig(big)
				big = nil
				_ = dl.SetReadDeadline(time.Time{})
				if s, ok := src.(shrinker); ok {
					s.Shrink()
				}
				continue
			}
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
		if big == nil && n == len(small) {
			big = getBig()
		}
	}
}

// closeWrite ends the write side of c: CloseWrite on TCP and Unix sockets,
// Close on a yamux stream (whose Close is a half-close: reads continue
// until the peer closes its side).
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// Spliced reports whether Join moves the bytes between a and b inside the
// kernel (splice(2) through a pipe, no copy loop in this process): both
// are unwrapped kernel stream sockets, *net.TCPConn or *net.UnixConn, and
// at least one is TCP (Go splices from and to TCP sockets only).
func Spliced(a, b net.Conn) bool {
	return canSplice && spliceable(a) && spliceable(b) && (isTCP(a) || isTCP(b))
}

func isTCP(c net.Conn) bool { _, ok := c.(*net.TCPConn); return ok }

func spliceable(c net.Conn) bool {
	switch v := c.(type) {
	case *net.TCPConn:
		return true
	case *net.UnixConn:
		return v.LocalAddr().Network() == "unix"
	}
	return false
}

// Join copies a to b and b to a until both directions have ended, half-
// closing each destination when its source ends. An error in either
// direction closes both connections. It returns the bytes copied each way
// and the first error other than a clean end of stream. The caller closes
// a and b afterwards.
//
// When Spliced(a, b), each direction is io.Copy, which Go turns into
// splice(2) between the sockets: no buffer of this process holds the
// bytes, and act learns of activity from the TCP socket's kernel counters
// (TCP_INFO) instead of from each read.
func Join(a, b net.Conn, act *Activity) (aToB, bToA int64, err error) {
	return JoinThen(a, b, act, nil)
}

// JoinThen is Join calling failed (when not nil) once, with the first
// error, before it closes either connection: the caller may still look at
// them (which side's peer is gone).
func JoinThen(a, b net.Conn, act *Activity, failed func(error)) (aToB, bToA int64, err error) {
	var once sync.Once
	closeBoth := func(err error) {
		once.Do(func() {
			if failed != nil {
				failed(err)
			}
		})
		a.Close()
		b.Close()
	}
	cp := Copy
	if Spliced(a, b) {
		cp = spliceCopy
		if act != nil {
			tc, _ := a.(*net.TCPConn)
			if tc == nil {
				tc = b.(*net.TCPConn)
			}
			probe := func() (time.Duration, bool) { return tcpIdle(tc) }
			act.probe.Store(&probe)
		}
	}
	type result struct {
		n   int64
		err error
	}
	abc := make(chan result, 1)
	go func() {
		n, err := cp(b, a, act)
		if err != nil {
			closeBoth(err)
		} else {
			closeWrite(b)
		}
		abc <- result{n, err}
	}()
	bToA, err2 := cp(a, b, act)
	if err2 != nil {
		closeBoth(err2)
	} else {
		closeWrite(a)
	}
	r := <-abc
	aToB = r.n
	err = r.err
	if err == nil {
		err = err2
	}
	return aToB, bToA, err
}

// spliceCopy is io.Copy between two kernel sockets: (*net.TCPConn).ReadFrom
// or WriteTo, which splice. It touches act once at the start; the probe
// set by Join tells of activity after that.
func spliceCopy(dst io.Writer, src io.Reader, act *Activity) (int64, error) {
	act.Touch()
	n, err := io.Copy(dst, src)
	if n > 0 {
		act.Touch()
	}
	return n, err
}
