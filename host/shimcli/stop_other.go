//go:build !linux

package shimcli

import "github.com/oac/sandbox-agent/host/kept"

type shimSignal int

const (
	sigTerm shimSignal = iota
	sigKill
)

// selfStart: no start time is recorded here.
func selfStart() uint64 { return 0 }

// signalShim: without a way to prove which process is the shim, none is
// signalled; a shim here is stopped through its control socket.
func signalShim(kept.ShimRecord, shimSignal) error {
	return errNoProof
}
