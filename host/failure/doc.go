// Package failure gives every way a sandbox run can fail a stable,
// machine-readable code (api.Failures lists them with the exit status of
// oac-shim and the HTTP status a node provider answers with).
//
// It owns the failure kinds that no lower package owns (ErrBootTimeout,
// ErrRuntimeFailed, ErrHostileGuest, ErrInvalidConfig, ErrOSUnsupported and
// the kinds a guest reports), and the ordered rules that map sentinel
// errors to codes with errors.Is: Code never reads an error's message. A
// new failure kind is a sentinel, a row in rules and a row in
// api.Failures; the tests check that every code has both.
//
// It must not decide what to do about a failure (stopping, retrying): it
// only names it.
package failure
