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

// shimProc: this OS gives no way to prove which process is the shim, so
// none is signalled; a shim here is stopped through its control socket
// and seen gone by its entry's lock.
type shimProc struct{}

func openShim(kept.ShimRecord) (*shimProc, error) { return nil, errNoProof }
func (*shimProc) signal(shimSignal) error         { return errNoProof }
func (*shimProc) exited() bool                    { return true }
func (*shimProc) close()                          {}
