package transport

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// dialSerial opens a character device (a virtio-serial port) read-write.
// It refuses anything but a character device so a misconfigured path cannot
// turn a regular file into the session.
func dialSerial(path string) (net.Conn, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open serial port %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		f.Close()
		return nil, fmt.Errorf("open serial port %s: not a character device", path)
	}
	return StreamConn(f, f, "serial:"+path), nil
}
