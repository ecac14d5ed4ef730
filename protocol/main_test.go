package protocol

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test ends with no goroutine left behind: yamux sessions, accept
// goroutines and readers must all be shut down by the code or the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
