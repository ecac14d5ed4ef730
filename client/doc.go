// Package client is the Go caller's side of oac-shim and of oac-guest
// helper, for a parent written in Go (the hosted platform, the node
// provider, a desktop helper), on Linux, macOS and Windows alike.
//
// It owns:
//   - launching `oac-shim run` (or `start` for a kept sandbox) with
//     typed Options beside the raw Args, the bootstrap and the daemon's
//     password handed over on stdin (--bootstrap -, --password-stdin: the
//     one path that works on every OS; the password is made here with
//     crypto/rand unless the caller gives one, and is never in argv, the
//     environment, a file or an event), then driving its control API and
//     event stream on stdio: one JSON object per line both ways, answers
//     matched to commands by id;
//   - StartReady, which returns once the sandbox is ready or leaves
//     nothing running; a bounded event history (Options.History) read as
//     an iterator (Shim.Events) or waited on (WaitState, WaitEvent), and a
//     context on every wait, command and stop;
//   - the errors a caller branches on: *FailedError (a failed state's
//     failure code), *CommandError (a refused command's answer code),
//     *ExitedError (a shim that ended otherwise, with its exit status and
//     what it said); Code and Retryable read the published codes of any
//     of them (api.Failures, api.AnswerCodes);
//   - Attach to a sandbox started with Options.Outlive, which outlives
//     its parent: its events replayed from a seq and its control API,
//     through `oac-shim attach`;
//   - Pool: N warm sandboxes (oac-shim run --warm) of one configuration,
//     refilled in the background (at most MaxBoots booting at once) when
//     one is claimed, fails or reaches its maximum age; Claim takes the
//     oldest still warm (a hit) or boots one (a miss), puts a password it
//     makes in the claim's bootstrap credentials (the shim takes none on
//     stdin with --warm), and waits for ready; hits, misses, refills,
//     expiries and failures, with ages, are PoolEvents; Close stops what
//     the pool holds, never what it handed out;
//   - the short commands on many sandboxes and on kept ones: List,
//     StopAll and StopNamed (oac-shim list --running, stop), CreateKept,
//     ResetKept, DestroyKept and ListKept (create, reset, destroy, list);
//   - HelperOutput: the events oac-guest helper writes on its stdout in an
//     E2B or microsandbox sandbox, read strictly and bounded from the exec
//     stream.
//
// It must not interpret the sandbox beyond the published schema (package
// api), keep the password anywhere but in memory, or outlive its shim's
// process unless asked: without Outlive the shim stops the sandbox when
// its stdin ends, so a parent that dies takes its sandboxes down with it.
package client
