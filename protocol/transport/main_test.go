package transport_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Dialers, listeners and the yamux sessions the tests run over these
// transports must all be shut down by the end of every test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
