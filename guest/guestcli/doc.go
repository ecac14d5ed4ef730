// Package guestcli is oac-guest's command line and the start of the agent
// process: flag parsing, the choice of how it runs (PID 1 of a VM, whose
// settings come from the kernel command line; PID 1 of a container or
// bwrap sandbox; a service or child, which becomes a subreaper), logging
// (the journal under systemd, else stderr), signal handling, and the
// wiring of packages initsys, reaper, vminit, agent and internal/systemd
// for one run. Exit codes: 0 after an orderly stop, 1 when the session or
// init failed, 2 for usage and transport errors.
//
// It owns the wiring only. It must not speak the protocol, apply the boot
// contract or touch guest paths itself (package agent does), mount or power
// off (packages initsys and vminit), or reap (package reaper).
package guestcli
