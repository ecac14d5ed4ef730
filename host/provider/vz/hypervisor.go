package vz

import (
	"context"
	"io"
	"net"
)

// Hypervisor creates virtual machines. The darwin build implements it with
// Virtualization.framework (github.com/Code-Hex/vz/v3); tests use a fake.
// It makes no decision: VMConfig says everything.
type Hypervisor interface {
	// Available returns nil when virtual machines can be created here, or
	// an error saying why not.
	Available() error
	// NewMachine builds and validates a machine; console receives the
	// guest's console output.
	NewMachine(cfg VMConfig, console io.Writer) (Machine, error)
}

// Machine is one virtual machine.
type Machine interface {
	Start(ctx context.Context) error
	// Stop stops the machine at once (no guest shutdown).
	Stop() error
	State() State
	// StateChanged delivers every state change.
	StateChanged() <-chan State
	// ListenVsock listens on the machine's virtio socket device for
	// connections the guest makes to the host on port.
	ListenVsock(port uint32) (net.Listener, error)
}
