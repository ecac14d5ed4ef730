// Package release builds the release artifacts of `make release` into one
// directory: the binaries cross-built without cgo and stamped with the
// version and commit, one archive per program and platform holding the
// binary, README.md, LICENSE, NOTICE and LICENSE.yamux, an SBOM beside each
// archive, and SHA256SUMS. Everything is reproducible: the same source,
// version and commit give the same bytes, whatever the directory, umask,
// time zone or clock of the build (archive times are the commit's time,
// owners are 0, entries sorted, modes fixed, gzip without a timestamp).
// cmd/oac-release is its command line; docs/releases.md the user's side.
package release
