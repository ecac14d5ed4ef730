//go:build !(darwin && cgo)

package vz

import (
	"fmt"
	"io"
	"runtime"

	"github.com/oac/sandbox-agent/host/provider"
)

// platformHypervisor: Virtualization.framework is reachable only from a
// cgo build on macOS.
func platformHypervisor() Hypervisor { return noHypervisor{} }

type noHypervisor struct{}

func (noHypervisor) Available() error {
	if runtime.GOOS == "darwin" {
		return fmt.Errorf("%w: vz: this oac-shim was built without cgo; Virtualization.framework needs a cgo build (CGO_ENABLED=1 on macOS)", provider.ErrUnavailable)
	}
	return fmt.Errorf("%w: vz: Virtualization.framework exists only on macOS", provider.ErrUnavailable)
}

func (h noHypervisor) NewMachine(VMConfig, io.Writer) (Machine, error) { return nil, h.Available() }
