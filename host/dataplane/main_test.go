package dataplane

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine running; a process
// started as the probe guest runs the probe instead.
func TestMain(m *testing.M) {
	if probeMain() {
		return
	}
	goleak.VerifyTestMain(m)
}
