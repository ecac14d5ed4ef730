//go:build linux

package e2e

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// deniedLiteral is an address no rule allows, dialed by its number (no
// name, so no resolver in the way): a policy refusal at connect.
const deniedLiteral = "192.0.2.1:80"

// promiseDirect: a sandbox started with --data-plane direct answers the
// workload's connects with the host's own sockets (the egress events say
// via "direct"; a refusal is ECONNREFUSED at connect, with the event) on
// every row where direct mode's guarantees hold here, and the workload
// cannot disconnect such a socket, bind it to an interface or list the
// host's interfaces through it; on every other row a starting event says
// why it is off and the same connections take the way they would without
// it. Either way the allowed probe gets through and the sandbox stops
// leaving nothing.
func promiseDirect(t *testing.T, c *confCase) {
	name := uniqueName("direct")
	spec := c.env.spec
	spec.name = name
	spec.args = append(append([]string(nil), spec.args...), "--data-plane", "direct")
	spec.bootstrap = confBootstrap(name, c.env.peer, "--probe", "dial-denied=dial:"+deniedLiteral, "--probe", "reach=reach:echo.test:7")
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
	has := func(via, target, decision string) {
		assert.NotEmpty(t, s.find(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == via && e.Target == target && e.Decision == decision
		}), "egress event %s %s %s", via, target, decision)
	}
	assert.Equal(t, "ok 200 conformance web: /direct", s.waitLog("daemon: probe direct-allowed=", 30*time.Second))
	denied := s.waitLog("daemon: probe dial-denied=", 30*time.Second)
	reach := s.waitLog("daemon: probe reach=", 30*time.Second)
	if c.env.direct {
		require.Empty(t, off, "direct mode's guarantees hold on this row: it must be on")
		require.NotEmpty(t, on, "the guest says direct mode is on")
		assert.Regexp(t, `^direct mode offered: host ports \d+-\d+ are this sandbox's share`, said("direct mode offered"))
		has("direct", "web.test:80", "allowed")
		has("direct", deniedLiteral, "denied")
		assert.Regexp(t, `^error .*connection refused`, denied, "a refusal is the connect's own error")
		assert.Equal(t, "ok ifconf=EPERM bindtodevice=EPERM disconnect=EPERM", reach,
			"the host's socket: the host's interfaces are not listed, it is bound to none, and it stays connected")
		// A refused raw connection is refused at connect, and the
		// workload asks why by the port it bound, as on the capture.
		why := whyLine.FindStringSubmatch(s.waitLog("daemon: probe why=", 30*time.Second))
		if assert.NotNil(t, why, "the why probe's line") {
			assert.Equal(t, []string{"ECONNREFUSED", "policy", "Denied", "web.test:5432"}, []string{why[1], why[3], why[4], why[5]})
			port, _ := strconv.Atoi(why[2])
			assert.NotEmpty(t, s.find(func(e api.Event) bool {
				return e.Event == api.KindEgress && e.Via == "direct" && e.Target == "web.test:5432" && e.SourcePort == port && e.Decision == "denied"
			}), "the host's event names the connect by the port the workload bound")
		}
	} else {
		require.Empty(t, on, "direct mode cannot be guarded on this row")
		require.NotEmpty(t, off, "a starting event says why direct mode is off")
		t.Logf("direct mode off: %s", off)
		has("transparent", "web.test:80", "allowed")
		has("transparent", deniedLiteral, "denied")
		assert.Equal(t, "ok ifconf=EPERM bindtodevice=EPERM disconnect=ok", reach,
			"the workload's own captured socket: its interfaces are not listed either, and it may disconnect it")
	}
	procs := sandboxProcs(s, name)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	c.nothingLeft(t, name, procs)
}
