package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/oac/sandbox-agent/api"
)

// ErrExited is returned for a request to a shim that has exited; an
// *ExitedError says more and matches it with errors.Is.
var ErrExited = errors.New("oac-shim has exited")

// FailedError is a failed state a caller did not wait for: Code is its
// failure code (api.Failures says what to do about each).
type FailedError struct {
	Code    string
	Message string
	Event   api.Event
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("sandbox failed (%s): %s", e.Code, e.Message)
}

// Retryable reports whether the same request may succeed later, unchanged
// (api.Failure.Retry of the code).
func (e *FailedError) Retryable() bool { return api.FailureOf(e.Code).Retry }

// Failure is the published description of the code: exit status, what to do.
func (e *FailedError) Failure() api.Failure { return api.FailureOf(e.Code) }

// ExitedError is a shim that ended without the state or answer asked
// for and without a failed state: a usage error (status 2, nothing
// started), a signal, or a stop. Stderr is the end of what it said.
type ExitedError struct {
	// Status is the exit status; -1 when a signal ended it or it is not
	// known yet.
	Status int
	// Stderr is the last lines the shim wrote on stderr (at most 4 KiB).
	Stderr string
	// What was waited for: "state ready", "answer to status", ...
	What string
}

func (e *ExitedError) Error() string {
	msg := "oac-shim has exited"
	if e.What != "" {
		msg = "oac-shim exited before " + e.What
	}
	if e.Status >= 0 {
		msg += fmt.Sprintf(" (exit status %d)", e.Status)
	}
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

// Is makes errors.Is(err, ErrExited) true.
func (e *ExitedError) Is(target error) bool { return target == ErrExited }

// SchemaError is a shim whose first line is of another schema version
// than this client's (api.SchemaVersion): a shim and a client of two
// releases. Every wait returns it; StartReady stops the shim.
type SchemaError struct{ Shim, Client int }

func (e *SchemaError) Error() string {
	return fmt.Sprintf("client: oac-shim writes schema version %d and this client reads %d: install the oac-shim of this client's release (or the client of the shim's)", e.Shim, e.Client)
}

// CommandError is a control command the shim refused or could not carry
// out: Code is the answer code (api.AnswerCodes). It unwraps to an
// *api.CommandError, so api.AnswerCode(err) gives the code too.
type CommandError struct {
	Command string
	Code    string
	Message string
}

func (e *CommandError) Error() string { return e.Command + ": " + e.Message }

// Unwrap gives the api's form of the refusal.
func (e *CommandError) Unwrap() error { return api.Refuse(e.Code, errors.New(e.Message)) }

// Retryable reports whether the same command may succeed later
// (api.AnswerCodeInfo.Retry of the code).
func (e *CommandError) Retryable() bool {
	for _, c := range api.AnswerCodes {
		if c.Code == e.Code {
			return c.Retry
		}
	}
	return false
}

// Code returns the published code an error carries: a failure code
// (*FailedError), an answer code (*CommandError), "exited" (*ExitedError),
// "timeout" or "cancelled" for a context's end; "" for nil and for errors
// of neither kind.
func Code(err error) string {
	var fe *FailedError
	var ce *CommandError
	var xe *ExitedError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &fe):
		return fe.Code
	case errors.As(err, &ce):
		return ce.Code
	case errors.As(err, &xe):
		return "exited"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return ""
}

// Retryable reports whether retrying what ended with err, unchanged, can
// help: the published word of its failure or answer code. A timeout is
// retryable (the host may be loaded); an exit or a cancel is not.
func Retryable(err error) bool {
	var fe *FailedError
	var ce *CommandError
	switch {
	case errors.As(err, &fe):
		return fe.Retryable()
	case errors.As(err, &ce):
		return ce.Retryable()
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}
