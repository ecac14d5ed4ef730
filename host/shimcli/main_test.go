package shimcli

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/egress"
)

// TestMain fails the suite if a test leaves a goroutine running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(egress.WatcherFunction))
}
