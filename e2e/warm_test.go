//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// warmShim starts oac-shim run --warm with its commands on stdin.
func warmShim(t *testing.T, args ...string) (*shim, io.Writer) {
	t.Helper()
	return warmShimOf(t, sandboxSpec{args: args})
}

// warmShimOf is warmShim with spec (its agent, its args).
func warmShimOf(t *testing.T, spec sandboxSpec) (*shim, io.Writer) {
	t.Helper()
	in, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	spec.stdin = in
	spec.args = append([]string{"--warm", "--control", "stdin"}, spec.args...)
	s := startShim(t, spec)
	in.Close()
	return s, w
}

// command writes a control line and returns its answer.
func (s *shim) command(w io.Writer, id, line string) api.Answer {
	s.t.Helper()
	_, err := io.WriteString(w, line+"\n")
	require.NoError(s.t, err)
	var found api.Answer
	require.Eventually(s.t, func() bool {
		_, raw := s.allEvents()
		for _, l := range raw {
			var a api.Answer
			if json.Unmarshal([]byte(l), &a) == nil && a.Event == api.KindAnswer && a.ID == id {
				found = a
				return true
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "the answer to %s (stderr: %s)", id, s.stderr.String())
	return found
}

// runShimCmd runs oac-shim with args and returns its output and status.
func runShimCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut strings.Builder
	cmd := exec.Command(bins.shim, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errOut.String(), code
}

// claimLine is a claim command with bootstrap and the other keys as JSON.
func claimLine(id, bootstrap string, more string) string {
	l := `{"id":"` + id + `","cmd":"claim","bootstrap":` + bootstrap
	if more != "" {
		l += "," + more
	}
	return l + "}"
}

// egressProbeScript asks for an allowed and a denied target, through the
// proxy and the capture, and says what each got.
const egressProbeScript = `
a=$(curl -sS -m 20 -x http://127.0.0.1:3128 http://up.test/ 2>&1)
c=$(curl -sS -m 20 --noproxy '*' http://up.test/ 2>&1)
d=$(curl -sS -m 20 -o /dev/null -w '%{http_code}' -x http://127.0.0.1:3128 http://denied.test/ 2>&1)
echo "probe allowed=$a captured=$c denied=$d"
exec sleep 1000
`

func upstream(t *testing.T) net.Listener {
	t.Helper()
	ln := listen(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "tenant-upstream") })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln
}

func TestAWarmSandboxHoldsNothingOfATenantUntilItsClaimThenKeepsEveryPromise(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	ln := upstream(t)
	s, cmds := warmShim(t)
	warm := s.waitState(api.StateWarm, bootTimeout)
	assert.Contains(t, warm.Message, "waits for a claim")
	procs := sandboxProcs(s, s.name)
	for _, p := range procs {
		assert.NotContains(t, []string{"bash", "oac-sandbox-io", "sleep"}, p.comm, "a warm guest runs no daemon: %+v", procs)
	}
	st := s.command(cmds, "s", `{"id":"s","cmd":"status"}`)
	require.True(t, st.OK)
	assert.Contains(t, string(mustJSON(t, st.Result)), `"state":"warm"`)
	assert.Contains(t, string(mustJSON(t, st.Result)), `"egress":[]`, "no egress rule before the claim")

	a := s.command(cmds, "c", claimLine("c", egressBootstrap(egressProbeScript), fmt.Sprintf(`"upstreams":["up.test:80=127.0.0.1:%d"]`, portOf(ln))))
	require.True(t, a.OK, "%+v", a)
	var res api.ClaimResult
	require.NoError(t, json.Unmarshal(mustJSON(t, a.Result), &res))
	assert.Equal(t, []string{fmt.Sprintf("upstream up.test:80=127.0.0.1:%d", portOf(ln))}, res.Egress)
	s.waitState(api.StateReady, bootTimeout)
	got := s.waitLog("probe ", time.Minute)
	assert.Equal(t, "allowed=tenant-upstream captured=tenant-upstream denied=403", got, "the claim's policy is the one in force, both ways out")

	again := s.command(cmds, "c2", claimLine("c2", egressBootstrap("exec sleep 1000"), ""))
	assert.False(t, again.OK)
	assert.Equal(t, api.AnswerConflict, again.Code, "a claimed sandbox is never warm again")

	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestABadClaimIsRefusedAndLeavesTheSandboxWarmAndClean(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	ln := upstream(t)
	busy := listen(t)
	s, cmds := warmShim(t)
	s.waitState(api.StateWarm, bootTimeout)
	up := fmt.Sprintf(`"upstreams":["up.test:80=127.0.0.1:%d"]`, portOf(ln))
	for _, tc := range []struct{ what, line, code string }{
		{"a bootstrap of another version", claimLine("b1", `{"version":99}`, up), api.AnswerInvalidArgument},
		{"a bootstrap with an unknown key", claimLine("b2", `{"version":1,"surprise":true}`, up), api.AnswerInvalidArgument},
		{"a bad egress rule", claimLine("b3", egressBootstrap("exec sleep 1000"), `"allow":["not a rule"]`), api.AnswerInvalidArgument},
		{"a forward on an address in use, after the policy was put in force", claimLine("b4", egressBootstrap("exec sleep 1000"),
			up+fmt.Sprintf(`,"forwards":[{"listen":"127.0.0.1:0","guest_port":4096},{"listen":"%s","guest_port":4096}]`, busy.Addr())), ""},
	} {
		id := strings.Split(strings.TrimPrefix(tc.line, `{"id":"`), `"`)[0]
		a := s.command(cmds, id, tc.line)
		assert.False(t, a.OK, "%s is refused", tc.what)
		if tc.code != "" {
			assert.Equal(t, tc.code, a.Code, "%s: %s", tc.what, a.Error)
		}
		st := s.command(cmds, id+"s", `{"id":"`+id+`s","cmd":"status"}`)
		body := string(mustJSON(t, st.Result))
		assert.Contains(t, body, `"state":"warm"`, "after %s the sandbox is still warm", tc.what)
		assert.Contains(t, body, `"egress":[]`, "and holds no rule of it")
		assert.Contains(t, body, `"forwards":[]`, "nor a forward")
	}
	// Then a good claim is taken.
	a := s.command(cmds, "ok", claimLine("ok", egressBootstrap(egressProbeScript), up))
	require.True(t, a.OK, "%+v", a)
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "allowed=tenant-upstream captured=tenant-upstream denied=403", s.waitLog("probe ", time.Minute))
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestAWarmSandboxNobodyClaimsStopsAtItsMaximumAge(t *testing.T) {
	needBwrap(t)
	s, _ := warmShim(t, "--warm-max-age", "3s")
	s.waitState(api.StateWarm, bootTimeout)
	stopped := s.waitState(api.StateStopped, 30*time.Second)
	assert.Contains(t, stopped.Message, "warm for its maximum age (3s) and never claimed")
	assert.NotEmpty(t, s.find(func(e api.Event) bool { return e.Event == api.KindWarmExpired }), "the expiry is an event of its own before the stop")
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestAStopWhileWarmLeavesNothing(t *testing.T) {
	needBwrap(t)
	s, _ := warmShim(t)
	s.waitState(api.StateWarm, bootTimeout)
	s.signal(syscall.SIGTERM)
	stopped := s.waitState(api.StateStopped, 30*time.Second)
	assert.Contains(t, stopped.Message, "stopped while warm")
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestTheTenantsFlagsAreRefusedWithWarm(t *testing.T) {
	for _, flag := range [][]string{{"--bootstrap", "x.json"}, {"--allow", "a.test:443"}, {"--forward", "127.0.0.1:0=4096"}, {"--volume", "/home=/tmp"}, {"--tenant", "t"}} {
		_, errOut, code := runShimCmd(t, append([]string{"run", "--warm", "--name", uniqueName("warm-flags")}, flag...)...)
		assert.Equal(t, 2, code, "%v", flag)
		assert.Contains(t, errOut, "--warm boots for nobody: "+flag[0])
	}
	_, errOut, code := runShimCmd(t, "run", "--warm-max-age", "1m", "--name", uniqueName("warm-flags"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--warm-max-age goes with --warm")
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// A guest booted for nobody that will not wait: its egress finds the
// empty policy, and a word on the control stream before its bootstrap
// fails it as hostile, leaving nothing.
func TestAWarmGuestThatSpeaksBeforeItsClaimFailsAsHostile(t *testing.T) {
	needBwrap(t)
	s, _ := warmShimOf(t, sandboxSpec{agent: bins.bad["warmtalk"]})
	denied := s.waitFor(func(e api.Event) bool { return e.Event == api.KindEgress && e.Target == "up:80" }, bootTimeout, "the warm guest's egress")
	assert.Equal(t, "denied", denied.Decision, "a warm sandbox's policy is empty")
	failed := s.exitFailed(api.CodeHostileGuest, 30*time.Second)
	assert.Contains(t, failed.Message, "before its bootstrap")
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestOacShimClaimClaimsAWarmSandboxByName(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	ln := upstream(t)
	dir := t.TempDir()
	keep, sock, boot := dir+"/keep", dir+"/ctl.sock", dir+"/boot.json"
	require.NoError(t, os.WriteFile(boot, []byte(egressBootstrap(egressProbeScript)), 0o600))
	s := startShim(t, sandboxSpec{args: []string{"--warm", "--control-socket", sock, "--keep-root", keep}})
	s.waitState(api.StateWarm, bootTimeout)

	_, errOut, code := runShimCmd(t, "claim", s.name, "--keep-root", keep, "--bootstrap", boot, "--allow", "not a rule")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "refused the claim (invalid_argument)")

	out, errOut, code := runShimCmd(t, "claim", s.name, "--keep-root", keep, "--bootstrap", boot,
		"--upstream", fmt.Sprintf("up.test:80=127.0.0.1:%d", portOf(ln)), "--forward", "127.0.0.1:0=4096")
	require.Equal(t, 0, code, errOut)
	var res api.ClaimResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	assert.Equal(t, uint64(1), res.Attempt)
	require.Len(t, res.Forwards, 1)
	assert.Equal(t, 4096, res.Forwards[0].GuestPort)
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "allowed=tenant-upstream captured=tenant-upstream denied=403", s.waitLog("probe ", time.Minute))

	_, errOut, code = runShimCmd(t, "claim", s.name, "--keep-root", keep, "--bootstrap", boot)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "refused the claim (conflict)")
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(30*time.Second))
}

// The session's bounds hold while warm: a guest booted for nobody that
// floods pings fails as hostile as any other.
func TestAWarmGuestThatFloodsTheSessionFailsAsHostile(t *testing.T) {
	needBwrap(t)
	s, _ := warmShimOf(t, sandboxSpec{agent: bins.bad["warmpings"]})
	failed := s.exitFailed(api.CodeHostileGuest, 30*time.Second)
	assert.Contains(t, failed.Message, "pings faster than")
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

// A claim's volumes (root shim, bwrap): bad ones are refused and leave the
// sandbox warm with nothing mounted; good ones are the guest's /home and
// /environment before its bootstrap (the agent makes /home/runtime and the
// workspace in them), the workload (uid 1000) reads and writes them but
// cannot take them away, and nothing is ever mounted on the host.
func TestAClaimsVolumesAreTheGuestsHomeAndEnvironment(t *testing.T) {
	needBwrap(t)
	home, env := claimVolume(t), claimVolume(t)
	notDir := filepath.Join(env, volumeMarker)
	s, cmds := warmShim(t)
	s.waitState(api.StateWarm, bootTimeout)
	script := `echo "seen=$(cat /environment/` + volumeMarker + `)"; echo tenant > /environment/workspace/made-inside
umount /environment 2>/dev/null && echo "umount=done" || echo "umount=refused"
echo "ids=$(stat -c %u /home/runtime)"; exec sleep 1000`
	boot := egressBootstrap(script)
	for _, tc := range []struct{ what, vols string }{
		{"a volume at /etc", `[{"guest":"/etc","host":"` + env + `"}]`},
		{"a host directory that does not exist", `[{"guest":"/home","host":"` + env + `/nope"}]`},
		{"a host file", `[{"guest":"/home","host":"` + notDir + `"}]`},
		{"a relative host path", `[{"guest":"/home","host":"tmp"}]`},
		{"/home twice", `[{"guest":"/home","host":"` + home + `"},{"guest":"/home","host":"` + env + `"}]`},
		{"three volumes", `[{"guest":"/home","host":"` + home + `"},{"guest":"/environment","host":"` + env + `"},{"guest":"/home","host":"` + env + `"}]`},
	} {
		a := s.command(cmds, "bad", claimLine("bad", boot, `"volumes":`+tc.vols))
		assert.False(t, a.OK, "%s is refused", tc.what)
		assert.Equal(t, api.AnswerInvalidArgument, a.Code, "%s: %s", tc.what, a.Error)
		st := s.command(cmds, "st", `{"id":"st","cmd":"status"}`)
		assert.Contains(t, string(mustJSON(t, st.Result)), `"state":"warm"`, "after %s the sandbox is still warm", tc.what)
	}
	assert.Empty(t, hostMounts(t, env), "nothing mounted on the host")

	a := s.command(cmds, "c", claimLine("c", boot, `"volumes":[{"guest":"/home","host":"`+home+`"},{"guest":"/environment","host":"`+env+`"}]`))
	require.True(t, a.OK, "%+v", a)
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "the tenant's workspace", s.waitLog("seen=", 30*time.Second), "the workload reads the host's file at /environment")
	assert.Equal(t, "refused", s.waitLog("umount=", 30*time.Second), "the workload cannot take its volume away")
	assert.Equal(t, "1000", s.waitLog("ids=", 30*time.Second))
	b, err := os.ReadFile(filepath.Join(env, "workspace", "made-inside"))
	require.NoError(t, err, "what the workload writes lands in the host's directory")
	assert.Equal(t, "tenant\n", string(b))
	assert.DirExists(t, filepath.Join(home, "runtime"), "the agent made /home/runtime in the claim's /home")
	assert.Empty(t, hostMounts(t, home), "nothing mounted on the host")
	assert.Empty(t, hostMounts(t, env))

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
	assert.FileExists(t, filepath.Join(env, "workspace", "made-inside"), "the volume outlives the sandbox")
}

// An unprivileged shim cannot enter its guest's mount namespace: a claim
// with a volume is refused as unsupported, and the sandbox stays warm for
// a claim without one.
func TestARootlessShimRefusesAClaimsVolumes(t *testing.T) {
	needRootless(t)
	spec := sandboxSpec{user: subIDUser}
	s, cmds := warmShimOf(t, spec)
	s.waitState(api.StateWarm, bootTimeout)
	vol := claimVolume(t)
	a := s.command(cmds, "v", claimLine("v", egressBootstrap("exec sleep 1000"), `"volumes":[{"guest":"/environment","host":"`+vol+`"}]`))
	assert.False(t, a.OK)
	assert.Equal(t, api.AnswerUnsupported, a.Code, a.Error)
	assert.Contains(t, a.Error, "boot the sandbox with --volume instead")
	st := s.command(cmds, "st", `{"id":"st","cmd":"status"}`)
	assert.Contains(t, string(mustJSON(t, st.Result)), `"state":"warm"`)
	a = s.command(cmds, "c", claimLine("c", egressBootstrap("exec sleep 1000"), ""))
	require.True(t, a.OK, "%+v", a)
	s.waitState(api.StateReady, bootTimeout)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(30*time.Second))
}
