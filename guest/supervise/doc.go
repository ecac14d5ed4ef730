// Package supervise decides when a supervised guest process is started
// again: jittered exponential backoff from 100 ms to 30 s, reset after a run
// that stayed up, and no restart at all for an exit the caller calls fatal
// (oac-sandbox-io's exit 2, a usage error, which a restart cannot fix).
//
// It owns the restart policy and its timing, with an injectable clock and
// random source so tests need no sleeps. It must not start, signal or reap
// processes itself: the caller's Start does that (package reaper remains the
// only owner of wait4), and it must not restart anything once its context
// is done (the agent is stopping).
package supervise
