package dataplane

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/egress"
)

// TestMain fails the suite if a test leaves a goroutine running (but the
// broker's process-wide host address watcher); a process started as the
// probe guest runs the probe instead.
func TestMain(m *testing.M) {
	if probeMain() {
		return
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(egress.WatcherFunction))
}
