package vz

import (
	"errors"
	"fmt"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
)

// State is a virtual machine's state, numbered as Virtualization.framework
// (and github.com/Code-Hex/vz/v3's VirtualMachineState) numbers them.
type State int

// States.
const (
	StateStopped State = iota
	StateRunning
	StatePaused
	StateError
	StateStarting
	StatePausing
	StateResuming
	StateStopping
	StateSaving
	StateRestoring
)

var stateNames = [...]string{"stopped", "running", "paused", "error", "starting", "pausing", "resuming", "stopping", "saving", "restoring"}

func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// ended reports whether a machine in state s has ended for good, and why
// (the instance's Err). Paused and the intermediate states are not an end.
func ended(s State) (bool, error) {
	switch s {
	case StateStopped:
		return true, errors.New("virtual machine stopped")
	case StateError:
		return true, errors.New("virtual machine stopped with an internal error of Virtualization.framework")
	}
	if s < StateStopped || s > StateRestoring {
		return true, fmt.Errorf("virtual machine in unknown %s", s)
	}
	return false, nil
}

// HVError is a Virtualization.framework error in portable form (the darwin
// code converts vz's NSError into it).
type HVError struct {
	Domain      string
	Code        int
	Description string
}

func (e *HVError) Error() string {
	return fmt.Sprintf("%s (%s code %d)", e.Description, e.Domain, e.Code)
}

// ErrUnsupportedOS is returned by the hypervisor when the running macOS
// lacks an API the provider uses.
var ErrUnsupportedOS = errors.New("this macOS lacks a Virtualization.framework API the vz provider needs")

// VZErrorDomain codes (VZErrorCode).
const (
	codeInternal             = 1
	codeInvalidConfiguration = 2
	codeInvalidState         = 3
	codeInvalidTransition    = 4
	codeInvalidDiskImage     = 5
	codeLimitExceeded        = 6
	codeNotSupported         = 10
)

// mapError turns a hypervisor error into the provider's errors, with what
// to do about it.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, provider.ErrUnavailable) || errors.Is(err, provider.ErrInvalidSpec) {
		return err
	}
	if errors.Is(err, ErrUnsupportedOS) {
		return fmt.Errorf("%w: vz: %s: %v (sandboxes need macOS 12 or newer)", provider.ErrUnavailable, op, err)
	}
	var hv *HVError
	if !errors.As(err, &hv) || hv.Domain != "VZErrorDomain" {
		if hv != nil && containsFold(hv.Description, "entitlement") {
			return fmt.Errorf("%w: vz: %s: %v (oac-shim must be signed with the com.apple.security.virtualization entitlement)", provider.ErrUnavailable, op, err)
		}
		return fmt.Errorf("vz: %s: %w", op, err)
	}
	switch hv.Code {
	case codeInvalidConfiguration, codeInvalidDiskImage:
		return fmt.Errorf("%w: vz: %s: %v", provider.ErrInvalidSpec, op, hv)
	case codeLimitExceeded:
		return fmt.Errorf("%w: vz: %s: %v (too many virtual machines are running on this Mac: stop some sandboxes)", provider.ErrUnavailable, op, hv)
	case codeNotSupported:
		return fmt.Errorf("%w: vz: %s: %v", provider.ErrUnavailable, op, hv)
	case codeInternal:
		if containsFold(hv.Description, "entitlement") {
			return fmt.Errorf("%w: vz: %s: %v (oac-shim must be signed with the com.apple.security.virtualization entitlement)", provider.ErrUnavailable, op, hv)
		}
	case codeInvalidState, codeInvalidTransition:
		return fmt.Errorf("%w: vz: %s: %v", provider.ErrNotStarted, op, hv)
	}
	return fmt.Errorf("vz: %s: %w", op, hv)
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
