// Package reaper is the single owner of wait4 in oac-guest.
//
// As PID 1 (or a child subreaper) the agent inherits every orphan in the
// sandbox and must reap them, but a loop calling wait4(-1) steals the exit
// status that exec.Cmd.Wait is waiting for ("waitid: no child processes").
// Here exactly one goroutine calls wait4: processes started through
// Reaper.Start get their exit status on a channel, orphans are reaped and
// counted. Start and the reap loop share a lock, so a child that exits before
// Start has registered it is still delivered to its owner.
//
// It must not be mixed with exec.Cmd.Wait, os.Process.Wait or any other
// wait call in the same process, and it owns SIGCHLD.
package reaper
