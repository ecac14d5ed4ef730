package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"
)

// listenOnce listens on path, in a directory only its owner can enter,
// returns the first connection and removes the socket before it returns:
// the session has one peer, and nobody can take a second one.
func listenOnce(ctx context.Context, path string) (net.Conn, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("listen on %s: %s must be a directory only its owner can enter (mode 0700)", path, dir)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listen on %s: remove the old socket: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	defer ln.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("listen on %s: no connection: %w", path, ctx.Err())
		}
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return c, nil
}

// DialRetry dials e until it answers or ctx ends, backing off from 5 ms
// to 200 ms: a peer that has not begun to listen yet is waited for.
func DialRetry(ctx context.Context, e Endpoint) (net.Conn, error) {
	backoff := 5 * time.Millisecond
	for {
		c, err := e.Dial(ctx)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// Relay joins a connection to a reader and a writer (a bridge's stdin
// and stdout) until either side ends: in is copied to c and c to out. It
// returns when c has nothing more to send (its peer closed it) or in has
// ended (then c is closed), with the error that ended it, nil for an end
// of file.
func Relay(c net.Conn, in io.Reader, out io.Writer) error {
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(c, in)
		errc <- err
	}()
	go func() {
		_, err := io.Copy(out, c)
		errc <- err
	}()
	err := <-errc
	c.Close()
	return err
}
