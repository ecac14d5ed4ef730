// Package buildinfo holds the version stamped into both binaries at link
// time (make sets it with -ldflags -X from git describe). It owns nothing
// else.
package buildinfo

// Version is the release or git description; "dev" in an unstamped build.
var Version = "dev"
