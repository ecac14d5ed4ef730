// Package persist is the injected persistence of kept sandboxes: what
// oac-shim create, start, reset, destroy and list know about a sandbox
// between runs. A Record says how a sandbox was created (provider, image
// reference and digest, the create flags that matter to start it again)
// and what happened to it last (its state, when it was created and last
// started). A Store keeps records by sandbox name and serializes the
// commands acting on one name (Lock: an exclusive flock, so two shims
// never act on one sandbox, and a lock whose holder died is free again).
//
// FileStore keeps each sandbox under a root directory:
//
//	ROOT/sandboxes/NAME/        0711, the sandbox's own directory
//	ROOT/sandboxes/NAME/lock    the per-name flock
//	ROOT/sandboxes/NAME/record.json  0600, written atomically (temp file,
//	                            fsync, rename, fsync of the directory)
//	ROOT/sandboxes/NAME/state/  0700, the provider's (provider.Keep.Dir)
//
// A torn write (a shim killed while saving) leaves a temporary file that
// Load ignores and the next Save replaces: the record is the old one or
// the new one, never a mix. Records are decoded strictly (unknown,
// repeated and case-variant keys are refused) and carry a schema version.
// Mem is the in-memory Store for tests.
//
// It owns the records, the lock and the layout of a sandbox's directory.
// It must not know what a provider keeps under state/, start anything, or
// decide what a state means for the lifecycle (package kept does).
package persist
