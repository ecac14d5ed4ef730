//go:build oac_doors_off

package doors

// Enabled is false in this test build: the agent reports the doors it
// finds and closes none (see on.go).
const Enabled = false
