// Package stage downloads pinned artifacts into a content-addressed store
// (STORE/sha256/HEX) and never places a file it has not verified.
//
// A download is hashed while it streams into STORE/tmp/HEX.partial; its
// size and sha256 are checked before the file is made read-only, synced
// and renamed into place. A partial file left by a truncated or stalled
// transfer is resumed with an HTTP Range request (a server that ignores
// ranges sends the whole file again), and the whole file is verified at
// the end. Two stagers of the same digest, in one process or several,
// share one download through STORE/tmp/HEX.lock, which its holder removes
// when it is done (a lock won on a removed file is taken again). A store
// file that no longer verifies is removed, reported (a repair event: what
// was wrong, what was done) and staged again. Each failure wraps one
// sentinel (ErrCorrupt, ErrTruncated, ErrWrongSize, ErrHTTP, ErrStalled,
// ErrStore) with a message that says what happened and what was kept.
// Progress is reported as events: a bar on a terminal, JSON lines
// otherwise.
//
// It owns the store's layout and the download. It must not decide what
// to download (the manifest does), trust a file it has not hashed, or
// follow anything but the pinned URL (HTTP redirects aside).
package stage
