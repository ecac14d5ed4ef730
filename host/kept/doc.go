// Package kept owns kept sandboxes: oac-shim create, start, reset,
// destroy and list act through its Service on the records of a
// persist.Store and the registered providers. Every command holds the
// name's lock for as long as it acts (start: for as long as the sandbox
// runs, through its Lease), and so does a throwaway sandbox of the name
// (Reserve, for oac-shim run), so no two commands decide about one name
// at once.
//
// Crash recovery: a record says "creating", "resetting" or "destroying"
// before the provider makes or removes anything, and the provider claims
// its runtime state under its own state root before it makes it. The
// next command on the name that finds such a record with its lock free
// discards the sandbox (the provider's Discard removes its kept state and
// what dead shims left in its state root) and says so. A directory with
// no record (a create killed before its first save, a throwaway run's)
// holds nothing of a provider's and is removed as it is, by the next
// command on its name or by any run. The named steps of each command are internal/crashpoint's.
//
// It also keeps the registry of running sandboxes (running.go): every
// shim that runs one, throwaway or kept, announces itself under
// KEEP_ROOT/running (a statedir claim held while it runs, and a record of
// its pid, process start time and control socket it writes itself), so
// oac-shim list --running and stop find the live ones; a record whose
// lock is free is a dead shim's, reported and removed, never taken for a
// live one. Records are read bounded and strictly. An outliving shim
// (--outlive-parent) Claims its entry first, keeps its journal and control
// socket there and Publishes its record later; at its end it leaves the
// journal with the free lock and no record (KeepOnClose), which attach
// reads (Leftover) and the next claim, listing or stop removes unreported.
// Each attach Pins the entry while it reads, so nothing removes a journal
// under a reader, and the last reader of an ended shim's journal removes
// it.
//
// It must not parse flags or print (package shimcli does), run a sandbox
// (package sandbox), or know what a provider keeps.
package kept
