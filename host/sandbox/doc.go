// Package sandbox runs one sandbox from create to destroy: it validates the
// Bootstrap before anything exists, creates and starts the provider's
// instance, accepts the guest's connection, negotiates the protocol, sends
// the Bootstrap, turns the guest's messages into lifecycle events
// (starting, ready, failed, stopped), carries log streams, hands egress
// and dns streams to the egress broker (offering the "egress" and "dns"
// capabilities only when it has one), and stops the
// guest in order (Shutdown, grace, kill) when asked. While the guest is
// connected it hands the caller a Session (Config.Attach) for forward
// streams and time pushes, each gated on the guest's capabilities, and it
// maps the daemon's URL in ready to the host's (Config.MapURL). For a
// provider whose guests have a clock of their own (a VM) it keeps the
// guest's clock within a second of the host's (clock.go): periodic reads,
// a read at once when the host's clock jumps or the guest reports one, a
// step when off, a clock event for a step over a second.
//
// It is the host's trust boundary for a session: every read from the guest
// is bounded in size and time, streams are capped, log volume is rate
// limited, and no guest-supplied value chooses a host path or reaches a log
// unescaped. It must not know how a runtime boots (package provider) or how
// frames are encoded (package protocol).
package sandbox
