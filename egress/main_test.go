package egress

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine running (but the
// process-wide host address watcher).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(WatcherFunction)) }
