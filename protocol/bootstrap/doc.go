// Package bootstrap owns the Bootstrap: everything the host tells a guest to
// run, and its validation. The shim validates a Bootstrap once before it
// creates anything; the guest validates it again, because it trusts nothing
// it receives.
//
// It must not perform any effect (no files, no processes): it only decodes
// and checks. Error messages name the rule that failed and never echo a
// submitted value, so they are safe to log and to show.
package bootstrap
