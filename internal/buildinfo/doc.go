// Package buildinfo holds the version stamped into both binaries at link
// time (make sets it with -ldflags -X from git describe). It owns nothing
// else.
package buildinfo
