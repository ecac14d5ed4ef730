package directguard

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine running; a process
// started as one of the tests' children (the hostile guest root, a share
// holder) runs that instead.
func TestMain(m *testing.M) {
	if childMain() {
		return
	}
	goleak.VerifyTestMain(m)
}
