package workload

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs this binary's other parts when a test started it as one:
// the launcher (LaunchArg), or a child process (childEnv). Otherwise it
// runs the tests and fails the suite if one leaves a goroutine running.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == LaunchArg {
		os.Exit(Main())
	}
	switch mode := os.Getenv(childEnv); mode {
	case "":
	case "idle":
		time.Sleep(time.Hour)
		os.Exit(0)
	case "attack":
		_ = json.NewEncoder(os.Stdout).Encode(attack())
		os.Exit(0)
	case "agent":
		_ = json.NewEncoder(os.Stdout).Encode(runScenario())
		os.Exit(0)
	default:
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}
