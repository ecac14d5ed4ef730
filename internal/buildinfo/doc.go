// Package buildinfo says which build a binary is: its version, commit and
// whether the tree was modified. make and oac-release stamp them at link
// time (-ldflags -X); a build without stamps (go install ...@vX.Y.Z, a
// plain go build) reports what the Go toolchain recorded in it. It owns
// nothing else.
package buildinfo
