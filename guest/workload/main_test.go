package workload

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs a child process's part when a test started this binary as
// one (childEnv), and otherwise fails the suite if a test leaves a
// goroutine running.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}
