package vminit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// FindVirtioPort returns the device path (devDir/vportNpM) of the
// virtio-serial port whose name is name, looking at
// sysDir/class/virtio-ports/*/name. It returns os.ErrNotExist (wrapped)
// when no port has that name yet.
func FindVirtioPort(sysDir, devDir, name string) (string, error) {
	class := filepath.Join(sysDir, "class", "virtio-ports")
	ents, err := os.ReadDir(class)
	if err != nil {
		return "", fmt.Errorf("list virtio-serial ports: %w (is virtio_console loaded?)", err)
	}
	var seen []string
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, port := range names {
		b, err := os.ReadFile(filepath.Join(class, port, "name"))
		if err != nil {
			continue // a port without a name
		}
		n := strings.TrimSpace(string(b))
		seen = append(seen, n)
		if n == name && !strings.ContainsAny(port, "/") && port != "." && port != ".." {
			return filepath.Join(devDir, port), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q (ports: %s): %w", name, strings.Join(seen, ", "), os.ErrNotExist)
}

// WaitVirtioPort polls FindVirtioPort until the port and its device node
// exist or ctx ends: devices appear asynchronously after their driver
// loads.
func WaitVirtioPort(ctx context.Context, sysDir, devDir, name string) (string, error) {
	for {
		p, err := FindVirtioPort(sysDir, devDir, name)
		if err == nil {
			if _, serr := os.Stat(p); serr == nil {
				return p, nil
			}
			err = fmt.Errorf("virtio-serial port %q found but %s does not exist (is devtmpfs mounted on /dev?)", name, p)
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
