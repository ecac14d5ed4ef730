// Package stage downloads pinned artifacts into a content-addressed store
// (STORE/sha256/HEX) and never places a file it has not verified.
//
// A download is hashed while it streams into STORE/tmp/HEX.partial; its
// size and sha256 are checked before the file is made read-only, synced
// and renamed into place. A partial file left by a truncated or stalled
// transfer is resumed with an HTTP Range request (a server that ignores
// ranges sends the whole file again), and the whole file is verified at
// the end. An artifact's URL is tried first, then its mirrors in order: a
// mirror that fails (an error status, another size, a stall, a cut
// connection, wrong bytes) is said so (a mirror event naming its host,
// never more of its URL) and the next one resumes what the failed one
// kept with a Range request; bytes are accepted from any mirror only by
// the whole file's sha256, and a file that does not verify is discarded,
// never placed. Two stagers of the same digest, in one process or several,
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
// follow anything but the pinned URL and mirrors (HTTP redirects aside).
package stage
