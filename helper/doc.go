// Package helper is oac-guest's helper mode (oac-guest helper): the boot
// contract and the egress policy of a hosted sandbox where no oac-shim runs
// beside the guest (E2B, microsandbox). The platform's own agent (envd,
// agentd) starts the helper inside the sandbox and writes one payload, Core's
// {runtime, sandbox_io}, to its stdin; the helper writes the published
// events, with mode "helper", as JSON lines on stdout; SIGTERM or stdin
// closing stops everything in order.
//
// It is the one place both sides of the project run in one process: the
// shim's session logic (package host/sandbox) drives the guest's agent
// (package guest/agent) over an in-process socket pair, and the egress
// broker (package egress) dials from the guest's own network, outside the
// workload's network namespace (which has only lo). So the events, the
// egress decisions and the stop order are those of the shim, by the same
// code, not a copy.
//
// It owns the payload's reading (one JSON value, bounded, nothing after it
// but the end of stdin), the in-process provider, the resolver the broker
// keeps (the guest's resolv.conf as it was before the agent placed its
// own), and the private mount namespace the helper runs in (what it mounts
// is never the platform's). It must not decide policy (package egress),
// apply the boot contract (package guest/agent) or turn guest messages into
// events (package host/sandbox).
package helper
