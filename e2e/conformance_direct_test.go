//go:build linux

package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/api"
)

// deniedLiteral is an address no rule allows, dialed by its number (no
// name, so no resolver in the way): a policy refusal at connect.
const deniedLiteral = "192.0.2.1:80"

// promiseDirect: a sandbox started with --data-plane direct either answers
// the workload's connects with the host's own sockets (the egress events
// say via "direct"; a refusal is ECONNREFUSED at connect, with the
// event), or says in a starting event why it cannot here and carries the
// same connections the way it would without it. Either way the allowed
// probe gets through and the sandbox stops leaving nothing.
func promiseDirect(t *testing.T, c *confCase) {
	name := uniqueName("direct")
	spec := c.env.spec
	spec.name = name
	spec.args = append(append([]string(nil), spec.args...), "--data-plane", "direct")
	spec.bootstrap = confBootstrap(name, c.env.peer, "--probe", "dial-denied=dial:"+deniedLiteral)
	spec.hosts = publicHosts
	s := startShim(c.rowT, spec)
	s.t = t
	s.waitState(api.StateReady, c.env.bootTimeout)
	said := func(part string) string {
		for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindState && strings.Contains(e.Message, part) }) {
			return e.Message
		}
		return ""
	}
	on, off := said("direct mode: the workload's connects"), said("direct mode unavailable")
	require.True(t, (on == "") != (off == ""), "one starting event says whether direct mode is on (on %q, off %q)", on, off)
	has := func(via, target, decision string) {
		assert.NotEmpty(t, s.find(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == via && e.Target == target && e.Decision == decision
		}), "egress event %s %s %s", via, target, decision)
	}
	assert.Equal(t, "ok 200 conformance web: /direct", s.waitLog("daemon: probe direct-allowed=", 30*time.Second))
	denied := s.waitLog("daemon: probe dial-denied=", 30*time.Second)
	if on != "" {
		t.Logf("direct mode on: %s", on)
		has("direct", "web.test:80", "allowed")
		has("direct", deniedLiteral, "denied")
		assert.Regexp(t, `^error .*connection refused`, denied, "a refusal is the connect's own error")
	} else {
		t.Logf("direct mode off: %s", off)
		has("transparent", "web.test:80", "allowed")
		has("transparent", deniedLiteral, "denied")
	}
	procs := sandboxProcs(s, name)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	c.nothingLeft(t, name, procs)
}
