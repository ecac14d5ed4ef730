package sockfile

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// MaxPath is the longest socket path the kernel takes (sun_path less NUL).
const MaxPath = 107

// Listen listens on a unix socket at path, mode 0600. Closing the
// listener removes the socket (only if it is still ours).
func Listen(path string) (net.Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket %q: the path must be absolute", path)
	}
	path = filepath.Clean(path)
	if len(path) > MaxPath {
		return nil, fmt.Errorf("socket %s: path longer than %d bytes", path, MaxPath)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("socket %s: a file that is not a socket is in the way", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another process is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("socket %s: remove the stale socket: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".oac-sock-")
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer os.RemoveAll(tmp)
	// The temporary name is short so a path near the limit still fits.
	tpath := filepath.Join(tmp, "s")
	if len(tpath) > MaxPath {
		return nil, fmt.Errorf("socket %s: the directory's path is too long for a socket", path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tpath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tpath, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(tpath, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	st, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &listener{UnixListener: ln, path: path, st: st}, nil
}

type listener struct {
	*net.UnixListener
	path string
	st   os.FileInfo
	once sync.Once
}

// Addr reports the socket's final path.
func (l *listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close stops listening and removes the socket if it is still the one this
// listener created.
func (l *listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if st, serr := os.Lstat(l.path); serr == nil && os.SameFile(st, l.st) {
			_ = os.Remove(l.path)
		}
	})
	return err
}
