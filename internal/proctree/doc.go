// Package proctree reads the processes of this machine from /proc: each
// one's parent, state and CPU time, and the descendants of one, for the
// tests and benchmarks that count what a sandbox runs or spends.
//
// It owns parsing /proc/PID/stat (whose command name may hold spaces and
// parentheses). It must not signal or change any process.
package proctree
