package bwrap

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine running. With
// OAC_BWRAP_TEST_LEFTOVER set the test binary is instead a process that
// waits forever (leftover_linux_test.go's stand-in for an orphaned bwrap).
func TestMain(m *testing.M) {
	if os.Getenv("OAC_BWRAP_TEST_LEFTOVER") != "" {
		select {}
	}
	goleak.VerifyTestMain(m)
}
