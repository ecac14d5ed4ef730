//go:build !linux

package selfreport

import (
	"runtime"
	"time"
)

// Doors: the stand-ins run in Linux guests only; elsewhere they are only
// compiled (make cross), and the probe says it did not look.
func Doors() []string { return ScanDoors().Findings }

// DoorScan is what ScanDoors found and what it cost.
type DoorScan struct {
	Findings  []string
	Took      time.Duration
	Entries   int
	Truncated []string
	Stages    []string
	Closed    []string
}

// ScanDoors does not probe off Linux: its one finding says so.
func ScanDoors() DoorScan {
	return DoorScan{Findings: []string{"not probed on " + runtime.GOOS}}
}
