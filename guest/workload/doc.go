// Package workload confines the workload, oac-sandbox-io and the daemon,
// the same way on every provider (see docs/workload.md).
//
// The agent starts each workload process through a launcher, oac-guest
// itself run with LaunchArg: Confinement.Command prepares it (a new
// session; a mount namespace of its own where the guest allows one,
// through a nested user namespace when the agent lacks CAP_SYS_ADMIN; the
// workload's cgroup where the guest has one), and Main, in the launcher,
// masks files in that namespace, copies oac-sandbox-io's program into an
// unreadable memfd so the kernel never lets it be dumped, sets rlimits,
// empties the bounding set, drops to 1000:1000 and every capability, sets
// no-new-privileges, installs the seccomp filter (Filter: a classic BPF
// program, one deny list per arch convention, foreign arches and x32
// killed; it also refuses the ioctls and socket options that reach past a
// socket into its network namespace, internal/netreach), in direct mode
// also a Landlock domain in which the kernel refuses every TCP bind and
// connect of the process's own and then a second filter that traps
// connect, bind and listen to the agent (InstallDirect; the listener goes
// to the agent on fd 5 and is closed before exec), and execs the program
// in its own place. Prepare also makes the
// agent not dumpable. A process whose spec masks files (the daemon beside
// oac-sandbox-io) is never run without its own mount namespace: Command
// and the launcher refuse it (ErrNotIsolated) where the guest cannot make
// one.
//
// It owns how a workload process is confined. It must not reap processes
// (package reaper), decide what runs or with which arguments (package
// agent), speak the protocol, or mount anything in the agent's own mount
// namespace (the launcher checks it is in another before it mounts).
package workload
