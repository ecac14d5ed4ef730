// Package systemd is what oac-shim and oac-guest do when systemd runs them
// as services: sd_notify messages (READY=1 once the sandbox is ready,
// STATUS= with each state change, STOPPING=1 when an orderly stop begins,
// WATCHDOG=1 at half the WATCHDOG_USEC interval) through
// github.com/coreos/go-systemd/v22/daemon, and logging to the journal with
// priorities when JOURNAL_STREAM says stderr is the journal
// (go-systemd's journal package).
//
// Outside systemd (no NOTIFY_SOCKET, no JOURNAL_STREAM) every call is a
// no-op. It must not decide anything about the sandbox: callers tell it
// what happened. Notification failures are logged once, never fatal.
package systemd
