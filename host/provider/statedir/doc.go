// Package statedir claims the per-sandbox state directory every provider
// keeps under its state root (ROOT/sandboxes/NAME): created 0700, held with
// an exclusive flock on NAME/lock for as long as the sandbox runs, so two
// sandboxes of one name never run at once on a host, and removed on
// release. A leftover directory whose lock is free is stale and reused.
//
// The holder of a directory may leave owner-only records in it
// (Dir.WriteFile, atomic); Scan lists a root's directories with their
// records, live holders (lock held) apart from dead ones (lock free, then
// removed), and Watch sees one holder let go and never takes a later
// holder of the name for it. A reader of what a holder leaves Pins the
// directory (a shared lock on NAME/pins): nothing removes or takes over a
// pinned directory.
//
// It also hands out numbered host-wide slots (ClaimSlot), each held by a
// lock file, for resources such as id ranges and vsock CIDs.
//
// It owns the directory, the slots and their locks. It must not know what
// providers put inside.
//
// It builds on Unix systems (flock) and Windows (LockFileEx).
package statedir
