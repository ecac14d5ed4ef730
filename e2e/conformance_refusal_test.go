//go:build linux

package e2e

import "testing"

// promiseRefusalExplained: a raw TCP client of the workload (no proxy,
// so the capture carries it) to a port the policy refuses is reset, asks
// the guest why by its own source port ($OAC_EGRESS_REFUSALS) and reads
// the host's own rule and reason, which the host's egress event gives
// for the same connection: on every row, whichever carrier it has.
func promiseRefusalExplained(t *testing.T, c *confCase) {
	s := c.live(t)
	port, _, reason := refusalSeen(t, s, "why", "web.test:5432", c.env.rawVia())
	t.Logf("%s: source port %d: %s", c.row.name, port, reason)
}
