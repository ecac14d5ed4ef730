// Package agent is oac-guest's main loop: it connects to the host over the
// transport, negotiates the protocol, receives and re-validates the
// Bootstrap, starts the daemon as UID/GID 1000 with no supplementary groups
// and no-new-privileges (with the egress proxy environment when the host
// offers egress: package egress), streams its output to the host, reports State
// changes, and on Shutdown (or SIGTERM) stops its children in order: TERM,
// grace, KILL.
//
// It owns the guest side of a session. It must not reap processes itself
// (package reaper owns wait4), mount filesystems (package initsys) or trust
// anything the host sends without validating it.
package agent
