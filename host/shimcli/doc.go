// Package shimcli is the command line of oac-shim: its command table
// (commands.go; package internal/cli parses, prints help and generates
// the completion scripts from it), each command's flags (each provider's
// own flags come from its registered driver; drivers.go lists the
// providers built in), the OS policy (evaluated once, for run and
// check), signal handling, exit codes, and the wiring of one running shim
// (shim.go): the lifecycle state machine (package lifecycle) runs the
// sandbox's attempts (package sandbox), whose state events pass through
// it so a stale attempt's are dropped; the forwards (package forward) get
// the live guest session; the control API (schema in package api, served
// by package apiserver on stdin and/or a 0600 unix socket) is carried out
// by the handler in control.go; systemd hears about every state (package
// internal/systemd). kept.go parses the commands of kept sandboxes
// (create, start, reset, destroy) and prints what package kept's
// Service did; start runs a kept sandbox with run's wiring, holding its
// lease, and run holds its name's lock through the same Service. list.go
// is oac-shim list (kept sandboxes, or --running: the shims that run one
// now) and the running shim's announcement; stop.go is oac-shim stop
// (NAME... or --all): each shim asked on its control socket or, proven
// by a pidfd and its start time (stop_linux.go), by SIGTERM, waited for
// within the grace, killed past it. secret.go takes the daemon's password
// the caller made from the first line of stdin (--password-stdin, the way
// that works on every OS) and refuses the descriptor flags on Windows,
// where no descriptor beyond stdio is inherited. outlive.go is
// --outlive-parent: the journal on the events sink (package journal), the
// control socket in the registry entry, the parent's stdout that never
// holds the shim up; attach.go is oac-shim attach NAME: the journal
// replayed and followed, stdin's commands carried to the control socket.
// cmd/oac-shim only calls Main.
//
// It must not know a provider's settings, contain sandbox logic (package
// sandbox), decode control commands itself (package api), or keep running
// after the sandbox ended: the shim exits when its current attempt has
// stopped or failed.
package shimcli
