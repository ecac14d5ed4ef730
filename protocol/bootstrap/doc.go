// Package bootstrap owns the Bootstrap: everything the host tells a guest to
// run, and its validation. The shim validates a Bootstrap once before it
// creates anything; the guest validates it again (ValidateInGuest), because
// it trusts nothing it receives.
//
// A Bootstrap carries the sandbox's own identity (tenant, environment,
// allocation), the oac-sandbox-io section with the content of the private
// bootstrap file (type SandboxIO, the contract of docs/contract.md), the daemon's
// argv, env and working directory, its HTTP Basic credentials and the
// environment variable names it reads them from, the health check, the
// hostname and the stop grace.
//
// Decoding is strict at two levels. Decode refuses any key that is not
// exactly a documented field name (encoding/json alone matches keys
// case-insensitively) and any key repeated in one object (encoding/json
// alone keeps the last), by walking the tokens along the Bootstrap type.
// DecodeSandboxIO, used for the private file wherever it appears, walks the
// tokens itself: exactly the contract's keys at every level, each once,
// integers where the contract has integers, nothing after the object, at
// most 16 KiB.
//
// Every rule has its own sentinel error (ErrNoLink, ErrPublicURLUnreachable,
// ErrWrongTenant, ...) for errors.Is. Messages name the rule and never echo a
// submitted value or credential, so they are safe to log and to show.
//
// It must not perform any effect (no files, no processes, no network): it
// only decodes and checks.
package bootstrap
