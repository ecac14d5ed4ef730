// Package agent is oac-guest's main loop: it connects to the host over the
// transport (or takes a connection made for it: oac-guest helper, whose
// host side runs in the same process), negotiates the protocol, receives and re-validates the
// Bootstrap, and applies the boot contract in order:
//
//  1. /home/runtime and /environment/workspace exist (created 0700,
//     1000:1000, when missing);
//  2. the private file /home/runtime/sandbox-io-bootstrap.json is written
//     (or, when the provider placed it, read and validated) by package
//     privfile;
//  3. oac-sandbox-io starts exactly as `oac-sandbox-io --bootstrap-file
//     /home/runtime/sandbox-io-bootstrap.json`, empty environment, and is
//     kept running by package supervise (exit 2 is a failure);
//  4. the daemon starts with the bootstrap's argv and env plus its
//     credentials; "bootstrap complete" is reported once both started;
//  5. the daemon's health is polled on the guest's loopback (package
//     health) and "ready" is reported with the URL and username.
//
// Every process runs as UID/GID 1000 with no supplementary groups, in a new
// session, with no-new-privileges, started through package workload's
// launcher (seccomp filter, no capabilities, limits; the daemon in a mount
// namespace without the private file; oac-sandbox-io never dumpable), in
// the workload's network namespace: the guest's own when it has only lo (OwnNetNS unset), else one of its own with
// only lo (package netns; the egress proxies, the resolver and the capture
// serve there, the health check and forwards dial there; without the
// privilege to make it the bootstrap fails); its stdout and stderr go to the host as
// log streams (with the egress proxy environment when the host offers
// egress: package egress; and, when it also offers dns, the guest's
// resolver and transparent capture of outgoing TCP: package transparent); its start, exit and restart are reported as
// Process messages. On Shutdown (or SIGTERM) it stops in order: no more restarts,
// TERM to each process group, grace, KILL, exits reported, "stopped".
//
// It also accepts the streams the host opens: forward streams only, each
// joined to 127.0.0.1:PORT (the port the header names, never another
// address), at most protocol.MaxStreams at once. A VM guest (OnTime set)
// lists the "time" capability and sets its clock from the host's Time
// messages; with SetClock it lists "clock", answers the host's clock
// reads and bounded steps (clock_settime) and reports the jumps its own
// clocks show (clock_linux.go). OnState lets oac-guest tell systemd about each state.
//
// It owns the guest side of a session. It must not reap processes itself
// (package reaper owns wait4), mount filesystems (package initsys), touch a
// path except through package privfile's no-symlink walk, put the daemon's
// password anywhere but the daemon's environment, dial anything but guest
// loopback for a forward, or trust anything the host sends without
// validating it.
package agent
