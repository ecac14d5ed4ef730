//go:build linux

package reaper

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine running. The one
// reaper serves the whole test binary (as it serves the whole agent), so
// it is closed before the check.
func TestMain(m *testing.M) {
	code := m.Run()
	testReaper.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
