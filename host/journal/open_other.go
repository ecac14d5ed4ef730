//go:build !windows

package journal

import "os"

// openShared opens a segment for reading.
func openShared(path string) (*os.File, error) { return os.Open(path) }
