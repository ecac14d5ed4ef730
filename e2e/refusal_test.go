//go:build linux

package e2e

import (
	"encoding/json"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// whyLine is the daemon stand-in's why: probe's answer.
var whyLine = regexp.MustCompile(`^ok reset=(\S+) port=(\d+) kind=(\S+) code=(\S+) target=(\S+) rule=(.*) reason=(.+)$`)

// refusalSeen checks what a why: probe printed (the capture's reset, or
// direct mode's refused connect, then the guest's refusal list read by
// the connection's own source port) against the host's egress event for
// the same connection (via: "transparent" or "direct"), and returns the
// port, the rule and the reason.
func refusalSeen(t *testing.T, s *shim, probe, target, via string) (port int, rule, reason string) {
	t.Helper()
	line := s.waitLog("daemon: probe "+probe+"=", 60*time.Second)
	m := whyLine.FindStringSubmatch(line)
	require.NotNil(t, m, "the why probe's line: %q", line)
	if via == "direct" {
		assert.Equal(t, "ECONNREFUSED", m[1], "direct mode refuses the connect itself")
	} else {
		assert.Equal(t, "ECONNRESET", m[1], "a refused connection that is not HTTP is reset")
	}
	port, _ = strconv.Atoi(m[2])
	assert.Equal(t, "policy", m[3], "the workload can tell the policy from the network")
	assert.Equal(t, "Denied", m[4])
	assert.Equal(t, target, m[5])
	rule, reason = m[6], m[7]
	assert.NotEmpty(t, reason)
	ev := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == via && e.Target == target && e.SourcePort == port
	}, 30*time.Second, "the egress event names the connection by its source port")
	assert.Equal(t, "denied", ev.Decision)
	assert.Equal(t, "Denied", ev.Code)
	assert.Equal(t, reason, ev.Reason, "the workload reads the host's own reason")
	assert.Equal(t, rule, ev.Rule)
	return port, rule, reason
}

// TestARefusedRawConnectionIsResetAndTheWorkloadAsksWhy runs a raw TCP
// client (no proxy, so the capture carries it) to a port the policy
// refuses on a real bwrap guest: it is reset, and the same program asks
// the guest why by its source port and reads the rule and the reason the
// host's event gives.
func TestARefusedRawConnectionIsResetAndTheWorkloadAsksWhy(t *testing.T) {
	needBwrap(t)
	needUnshare(t)
	// db.example.test resolves on the host (to an address no class
	// refuses; nothing dials it), so the guest's resolver hands out an
	// address for it; the rule allows port 443 only.
	argv, _ := json.Marshal([]string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", strconv.Itoa(daemonPort),
		"--probe", "why=why:db.example.test:5432"})
	s := startShim(t, sandboxSpec{
		bootstrap: `{"version":1,"stop_grace":"1s","daemon":{"argv":` + string(argv) + `,"env":["OAC_SERVER_USERNAME=u","OAC_SERVER_PASSWORD=p"]}}`,
		hosts:     "127.0.0.1 localhost\n::1 localhost\n" + publicAddr + " db.example.test\n",
		// The capture's reset (direct mode refuses at connect: the
		// conformance suite's direct column shows that).
		args: []string{"--data-plane", "fd", "--install", "oac-daemon-standin=" + bins.daemon, "--allow", "*.example.test:443"},
	})
	s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == api.StateStarting && regexp.MustCompile(`transparent egress:`).MatchString(e.Message)
	}, bootTimeout, "transparent egress started")
	port, rule, reason := refusalSeen(t, s, "why", "db.example.test:5432", "transparent")
	t.Logf("source port %d, rule %q, reason %q", port, rule, reason)
	assert.Equal(t, "*.example.test:443", rule)
	assert.Equal(t, "port 5432 is not allowed for db.example.test (its rule allows port 443); nothing was resolved", reason)

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
