// Package journal keeps an outliving shim's events on disk for oac-shim
// attach: a bounded series of segment files of JSON lines in the shim's
// running-registry directory (KEEP_ROOT/running/sandboxes/NAME), each
// named by the seq of its first line, mode 0600. The writer starts a new
// segment when the current one would pass SegmentBytes and drops the
// oldest whole segment beyond Segments, so the journal never holds more
// than Segments*SegmentBytes (plus one line). The reader replays from a
// seq, follows the writer across segments, reports the seqs it cannot
// give (dropped with an old segment, or a line that was never written
// whole) as a Gap, and tolerates a torn final line: a line without its
// newline is not a line until the newline comes, and one that never comes
// is reported as torn (its writer died writing it).
//
// The journal's lines are untrusted-ish after a crash: the reader takes
// only whole lines of at most MaxLine bytes that are one JSON object with
// a positive seq greater than the one before; anything else is damage,
// skipped and reported through the gap it leaves. It must not decide what
// the events mean (package shimcli's attach does), nor where the
// directory is (package kept's registry).
package journal
