// Package crashpoint names the steps of oac-shim's commands at which a
// crash test kills the process, and says for each what the next command
// on the sandbox's name must find: the state before the crashed command,
// nothing, or the command's work done.
//
// Points lists every point. Hit marks one in the code; in a release build
// it does nothing. Built with the tag crashpoints, Hit kills the process
// with SIGKILL when $OAC_CRASH_AT names the point (after writing
// "crash point NAME" to stderr, so a test knows the kill was the point's
// and not an accident). The e2e suite builds that binary and runs every
// command at every point on every provider; a point declared here is in
// that matrix and in the table of docs/kept.md (a test holds the three
// together), and a point can only be hit if it is declared here.
//
// It owns the names and the promises. It must not know how a command
// reaches its steps.
package crashpoint
