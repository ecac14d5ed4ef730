//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// The column "warm, then claimed": the row's sandbox booted with --warm
// holds nothing of a tenant's (no process started in it, no private
// file, no egress rule, no forward); claimed with the row's hosted
// bootstrap, identity and upstreams, it keeps the promises of the
// columns before (hosted ready, the contract, egress both ways) and stops
// leaving nothing.

// tenantArgs splits a row's run flags into those of the operator and the
// tenant's identity and named upstreams (which a claim carries).
func tenantArgs(args []string) (operator []string, id bootstrap.Identity, upstreams []string) {
	for i := 0; i < len(args); i++ {
		if i+1 < len(args) {
			switch args[i] {
			case "--tenant":
				id.TenantID = args[i+1]
				i++
				continue
			case "--environment":
				id.EnvironmentID = args[i+1]
				i++
				continue
			case "--allocation":
				id.AllocationID = args[i+1]
				i++
				continue
			case "--upstream":
				upstreams = append(upstreams, args[i+1])
				i++
				continue
			}
		}
		operator = append(operator, args[i])
	}
	return operator, id, upstreams
}

// warmRun is the row's sandbox name booted with --warm (its commands on
// stdin, from cmds) and the claim that makes it the row's hosted sandbox:
// the row's bootstrap with its identity, and its upstreams; on a row whose
// claims bring volumes, also a host directory (vol, holding a file
// volumeMarker) as its /environment.
func (c *confCase) warmRun(t *testing.T, name string, spec sandboxSpec) (_ sandboxSpec, in, cmds *os.File, claim, vol string) {
	t.Helper()
	spec.name = name
	operator, id, upstreams := tenantArgs(spec.args)
	in, cmds, err := os.Pipe()
	require.NoError(t, err)
	if c.env.claimVolumes {
		vol = claimVolume(t)
	}
	t.Cleanup(func() { cmds.Close() })
	spec.stdin = in
	spec.bootstrap = ""
	spec.args = append(append([]string(nil), operator...), "--warm", "--control", "stdin")
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(confBootstrap(name, c.env.peer)), &doc))
	if id.TenantID != "" {
		doc["sandbox"] = map[string]string{"tenant_id": id.TenantID, "environment_id": id.EnvironmentID, "allocation_id": id.AllocationID}
	}
	ups, _ := json.Marshal(upstreams)
	claim = fmt.Sprintf(`{"id":"claim","cmd":"claim","bootstrap":%s,"upstreams":%s}`, mustJSON(t, doc), ups)
	if vol != "" {
		claim = withVolume(claim, vol)
	}
	return spec, in, cmds, claim, vol
}

// volumeMarker is the file a claim's volume holds before the claim.
const volumeMarker = "from-the-host"

// claimVolume is a host directory a guest's root (an unprivileged host id)
// can write, with volumeMarker in it.
func claimVolume(t *testing.T) string {
	d, err := os.MkdirTemp("", "oac-e2e-claim-vol-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	require.NoError(t, os.Chmod(d, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(d, volumeMarker), []byte("the tenant's workspace\n"), 0o644))
	return d
}

// withVolume adds vol as the claim's /environment.
func withVolume(claim, vol string) string {
	return strings.TrimSuffix(claim, "}") + `,"volumes":[{"guest":"/environment","host":` + strconv.Quote(vol) + `}]}`
}

// hostMounts lists the lines of the host's mountinfo that name what (a
// directory, a sandbox's name).
func hostMounts(t *testing.T, what string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return out
}

func promiseWarmThenClaimed(t *testing.T, c *confCase) {
	name := uniqueName("conf-warm")
	spec := c.env.spec
	spec.hosts = publicHosts
	spec, in, cmds, claim, vol := c.warmRun(t, name, spec)
	s := startShim(c.rowT, spec)
	s.t = t
	in.Close()
	stopped := false
	defer func() {
		if !stopped && !s.exited() {
			s.signal(syscall.SIGTERM)
			s.exit(30 * time.Second)
		}
	}()

	s.waitState(api.StateWarm, c.env.bootTimeout)
	// Warm: nothing of a tenant's, on every row (the guest reports every
	// process it starts; here it started none).
	assert.Empty(t, s.find(func(e api.Event) bool { return e.Event == api.KindProcess }), "a warm guest starts no process")
	st := s.command(cmds, "w1", `{"id":"w1","cmd":"status"}`)
	body := string(mustJSON(t, st.Result))
	assert.Contains(t, body, `"state":"warm"`)
	assert.Contains(t, body, `"egress":[]`, "no egress rule before the claim")
	assert.Contains(t, body, `"forwards":[]`, "no forward before the claim")
	warmProcs := sandboxProcs(s, name)
	for _, p := range warmProcs {
		assert.NotContains(t, []string{"oac-sandbox-io", "oac-daemon-stan"}, p.comm, "no oac-sandbox-io and no daemon in a warm sandbox")
		if p.comm == "oac-guest" {
			_, err := os.Lstat(filepath.Join("/proc", fmt.Sprint(p.pid), "root", bootstrap.SandboxIOFile))
			if !os.IsPermission(err) {
				assert.True(t, os.IsNotExist(err), "a warm guest has no private file (%v)", err)
			}
		}
	}

	if !c.env.claimVolumes {
		// A claim with a volume is refused where volumes cannot come
		// with a claim, and leaves the sandbox warm for the next.
		refused := s.command(cmds, "cv", strings.Replace(withVolume(claim, claimVolume(t)), `"id":"claim"`, `"id":"cv"`, 1))
		assert.False(t, refused.OK, "a claim with a volume is refused on this row")
		assert.Equal(t, api.AnswerUnsupported, refused.Code, refused.Error)
		st := s.command(cmds, "w2", `{"id":"w2","cmd":"status"}`)
		assert.Contains(t, string(mustJSON(t, st.Result)), `"state":"warm"`, "still warm after the refused claim")
	}

	a := s.command(cmds, "claim", claim)
	require.True(t, a.OK, "the claim is taken: %s", a.Error)
	s.waitState(api.StateReady, c.env.bootTimeout)
	if vol != "" {
		// The volume is the guest's /environment: the host's file is
		// there, and the agent made its workspace in it.
		var agent int
		for _, p := range sandboxProcs(s, name) {
			if p.comm == "oac-guest" {
				agent = p.pid
			}
		}
		require.NotZero(t, agent, "the guest's agent")
		b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(agent), "root", "environment", volumeMarker))
		assert.NoError(t, err, "the guest sees the claim's volume at /environment")
		assert.Equal(t, "the tenant's workspace\n", string(b))
		assert.DirExists(t, filepath.Join(vol, "workspace"), "the agent made /environment/workspace in the volume")
		assert.Empty(t, hostMounts(t, vol), "no mount of the volume on the host")
		defer func() {
			assert.FileExists(t, filepath.Join(vol, volumeMarker), "the volume outlives the sandbox")
			assert.DirExists(t, filepath.Join(vol, "workspace"))
			assert.Empty(t, hostMounts(t, vol), "no mount of the volume on the host")
		}()
	}

	claimed := &confCase{row: c.row, env: c.env, fix: c.fix, rowT: c.rowT, name: name, s: s, ifaces: c.ifaces, procs: append(warmProcs, sandboxProcs(s, name)...)}
	for _, p := range []confPromise{
		{"hosted bootstrap ready", promiseHostedReady},
		{"private file, ids, no caps, health", promiseContract},
		{"egress: proxies and capture", promiseEgress},
		{"SIGTERM: stopped, nothing left", promiseStopLeavesNothing},
	} {
		t.Run(strings.ReplaceAll(p.name, " ", "_"), func(t *testing.T) { p.check(t, claimed) })
	}
	stopped = true
}
