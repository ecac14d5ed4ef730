// Package client launches and drives oac-shim processes for a parent
// written in Go (the node provider, a desktop app's helper): it starts
// `oac-shim run --control stdin`, reads its events, sends control
// commands and matches their answers by id, waits for lifecycle states,
// and stops the sandbox in order. For many sandboxes from one parent,
// List and StopAll (and StopNamed) run oac-shim list --running and stop
// --all and return their reports: every running sandbox of a keep root
// with its control socket, and each one stopped in order within a grace.
//
// It owns the parent's side of the control API and the event stream: one
// JSON object per line both ways. It must not interpret the sandbox
// beyond the documented schema, hold the daemon's password (read it from
// --password-file when you need it), or outlive its shim's process: the
// shim stops the sandbox when its stdin ends, so a parent that dies
// takes its sandboxes down with it.
package client
