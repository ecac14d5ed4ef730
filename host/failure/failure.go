package failure

import (
	"errors"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/errmark"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Failure kinds of a sandbox run; mark errors with them (With) where the
// failure happens, keeping the message.
var (
	// ErrBootTimeout: the guest did not connect or become ready in time.
	ErrBootTimeout = errors.New("boot timeout")
	// ErrRuntimeFailed: the runtime could not create or start the
	// sandbox, exited, or the connection to the guest was lost.
	ErrRuntimeFailed = errors.New("runtime failed")
	// ErrHostileGuest: the guest exceeded a bound no correct guest
	// reaches.
	ErrHostileGuest = errors.New("guest exceeded a protocol bound")
	// ErrInvalidConfig: the host side's configuration (a path, a forward,
	// the control socket, the password output) is wrong or could not be
	// applied; nothing was created.
	ErrInvalidConfig = errors.New("invalid host configuration")
	// ErrOSUnsupported: the OS policy blocks this OS version.
	ErrOSUnsupported = errors.New("OS not supported")

	// What a guest reports (GuestReason maps protocol.Reason* to these).
	ErrGuestBootstrap  = errors.New("the guest refused the bootstrap")
	ErrDaemonUnhealthy = errors.New("daemon not healthy")
	ErrDaemonFailed    = errors.New("daemon failed")
	ErrSandboxIOFailed = errors.New("oac-sandbox-io failed")
	ErrPlatformDoor    = errors.New("a platform door to the host is open")
	ErrGuestFailed     = errors.New("guest agent failed")
)

// With marks err as kind without changing its message (nil stays nil).
func With(kind, err error) error { return errmark.With(kind, err) }

// GuestReason returns the kind of a failure the guest reported with
// reason (protocol.Reason*); unknown or missing reasons are ErrGuestFailed.
func GuestReason(reason string) error {
	switch reason {
	case protocol.ReasonBootstrap:
		return ErrGuestBootstrap
	case protocol.ReasonDaemonUnhealthy:
		return ErrDaemonUnhealthy
	case protocol.ReasonDaemonFailed:
		return ErrDaemonFailed
	case protocol.ReasonSandboxIO:
		return ErrSandboxIOFailed
	case protocol.ReasonPlatformDoor:
		return ErrPlatformDoor
	}
	return ErrGuestFailed
}

// rule maps errors matching kind to code.
type rule struct {
	kind error
	code string
}

// rules are tried in order; the first whose kind matches (errors.Is) gives
// the code. More specific kinds come first: a hostile guest is hostile
// whatever else its error wraps, and the Link rules are bootstrap rules
// too.
var rules = []rule{
	{ErrHostileGuest, api.CodeHostileGuest},
	// The agent's own protocol violations. A truncated frame is not one:
	// it is what a connection cut mid-frame looks like.
	{protocol.ErrFrameTooLarge, api.CodeHostileGuest},
	{protocol.ErrUnknownType, api.CodeHostileGuest},
	{protocol.ErrBadFlags, api.CodeHostileGuest},
	{protocol.ErrBadBody, api.CodeHostileGuest},
	{protocol.ErrUnexpectedType, api.CodeHostileGuest},

	{bootstrap.ErrNoLink, api.CodeNoLink},
	{bootstrap.ErrPublicURLUnreachable, api.CodePublicURLUnreachable},
	{bootstrap.ErrInvalid, api.CodeInvalidBootstrap},
	{ErrGuestBootstrap, api.CodeInvalidBootstrap},

	{ErrOSUnsupported, api.CodeOSUnsupported},
	// Before ErrUnavailable: a missing profile is the one thing to install.
	{apparmor.ErrProfileMissing, api.CodeAppArmorMissing},
	{provider.ErrUnavailable, api.CodeProviderUnavailable},
	{provider.ErrInvalidSpec, api.CodeInvalidConfig},
	{provider.ErrExists, api.CodeInvalidConfig},
	{ErrInvalidConfig, api.CodeInvalidConfig},
	{protocol.ErrVersionMismatch, api.CodeGuestIncompatible},
	// Bytes that are not a yamux session: not an oac agent, or a
	// transport that carries more than the session.
	{yamux.ErrInvalidVersion, api.CodeGuestIncompatible},
	{yamux.ErrInvalidMsgType, api.CodeGuestIncompatible},

	{ErrBootTimeout, api.CodeBootTimeout},
	{ErrDaemonUnhealthy, api.CodeDaemonUnhealthy},
	{ErrDaemonFailed, api.CodeDaemonFailed},
	{ErrSandboxIOFailed, api.CodeSandboxIOFailed},
	{ErrPlatformDoor, api.CodePlatformDoorOpen},
	{ErrGuestFailed, api.CodeGuestFailed},
	{ErrRuntimeFailed, api.CodeRuntimeFailed},
	{protocol.ErrTruncated, api.CodeRuntimeFailed},
}

// WithCode returns err carrying code itself, for a failure known only by
// its code (a state reported earlier); Code returns code for it.
func WithCode(code string, err error) error {
	if err == nil {
		return nil
	}
	return &coded{err: err, code: code}
}

type coded struct {
	err  error
	code string
}

func (c *coded) Error() string { return c.err.Error() }
func (c *coded) Unwrap() error { return c.err }

// Code returns the failure code of err: "" for nil, api.CodeInternal
// when no rule matches.
func Code(err error) string {
	if err == nil {
		return ""
	}
	var c *coded
	if errors.As(err, &c) && c.code != "" {
		return c.code
	}
	for _, r := range rules {
		if errors.Is(err, r.kind) {
			return r.code
		}
	}
	return api.CodeInternal
}

// Exit returns oac-shim's exit status for a run that ended with err
// (api.ExitOK for nil).
func Exit(err error) int {
	if err == nil {
		return api.ExitOK
	}
	return api.FailureOf(Code(err)).Exit
}
