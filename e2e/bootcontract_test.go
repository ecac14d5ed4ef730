//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
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

// The sandbox's own identity, given to oac-shim with --tenant,
// --environment and --allocation.
const (
	tenantID      = "0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21"
	environmentID = "1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32"
	allocationID  = "2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43"
	otherID       = "3e8bac8d-6f4a-4b52-8dbe-af9a8b7c6d54"
	// linkCredential must never appear outside the private file.
	linkCredential = "SECRET-link-credential-4f1c9a"
	daemonPort     = 4096
	daemonBin      = "/usr/local/bin/oac-daemon-standin"
)

// identityArgs name the sandbox and install the stand-in fixtures.
func identityArgs() []string {
	return []string{
		"--tenant", tenantID, "--environment", environmentID, "--allocation", allocationID,
		"--sandbox-io", bins.sandboxIO, "--install", "oac-daemon-standin=" + bins.daemon,
	}
}

// contract returns a valid hosted bootstrap: oac-sandbox-io with its private
// file, the daemon stand-in with generated credentials and a health check.
func contract(linkHost string, daemonArgs ...string) *bootstrap.Bootstrap {
	grace := bootstrap.Duration(2 * time.Second)
	argv := append([]string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", strconv.Itoa(daemonPort)}, daemonArgs...)
	return &bootstrap.Bootstrap{
		Version: 1, Hostname: "contract",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://" + linkHost + "/api/v1/sandbox-link", Credential: linkCredential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 3},
		}},
		Daemon:      &bootstrap.Process{Argv: argv, Env: []string{"XDG_STATE_HOME=/home/runtime/.state"}},
		Credentials: &bootstrap.Credentials{UsernameEnv: "OAC_SERVER_USERNAME", PasswordEnv: "OAC_SERVER_PASSWORD"},
		Health:      &bootstrap.Health{Port: daemonPort},
		StopGrace:   &grace,
	}
}

func encode(t *testing.T, b *bootstrap.Bootstrap) string {
	t.Helper()
	data, err := json.Marshal(b)
	require.NoError(t, err)
	return string(data)
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func isProcess(name, message string) func(api.Event) bool {
	return func(e api.Event) bool {
		return e.Event == api.KindProcess && e.Process == name && strings.HasPrefix(e.Message, message)
	}
}

func TestBootContractFileProcessesHealthReadyAndStop(t *testing.T) {
	needBwrap(t)
	b := contract("link.example.com", "--healthy-after-requests", "3")
	pwFile := filepath.Join(t.TempDir(), "password")
	s := startShim(t, sandboxSpec{bootstrap: encode(t, b), args: append(identityArgs(), "--password-file", pwFile)})

	ready := s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	// The stand-in answered 503 to the first two authenticated requests.
	assert.Regexp(t, `daemon healthy after ([3-9]|\d\d+) attempt\(s\)`, ready.Message, "ready only once health answered 200")
	assert.Equal(t, "200 after 3 authenticated request(s)", s.waitLog("daemon: health=", bootTimeout))
	complete := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "bootstrap complete")
	}, bootTimeout, "bootstrap complete")
	assert.Equal(t, "guest: bootstrap complete: oac-sandbox-io and the daemon started", complete.Message)

	// The private file: exact mode, owner and content.
	want, err := b.SandboxIO.Bootstrap.Encode()
	require.NoError(t, err)
	assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", s.waitLog("sandbox-io: file=", bootTimeout))
	assert.Equal(t, "mode=0700 uid=1000 gid=1000", s.waitLog("sandbox-io: dir=", bootTimeout))
	assert.Equal(t, sha(string(want)), s.waitLog("sandbox-io: file-sha256=", bootTimeout))
	assert.Equal(t, bootstrap.CredentialDigest(linkCredential), s.waitLog("sandbox-io: credential-sha256=", bootTimeout))

	// oac-sandbox-io as the contract says.
	assert.Equal(t, "ok", s.waitLog("sandbox-io: argv=", bootTimeout))
	assert.Equal(t, "0", s.waitLog("sandbox-io: env=", bootTimeout), "an empty environment")
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("sandbox-io: ids=", bootTimeout))
	assert.Equal(t, "true", s.waitLog("sandbox-io: session-leader=", bootTimeout))
	assert.Equal(t, "1", s.waitLog("sandbox-io: nnp=", bootTimeout))
	assert.Equal(t, "/environment/workspace", s.waitLog("sandbox-io: cwd=", bootTimeout))

	// The daemon: 1000:1000, its credentials in its environment only.
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", bootTimeout))
	assert.Equal(t, "false", s.waitLog("daemon: password-in-argv=", bootTimeout))
	assert.Equal(t, "ALL_PROXY,HOME,HTTPS_PROXY,HTTP_PROXY,NO_PROXY,OAC_EGRESS_REFUSALS,OAC_SERVER_PASSWORD,OAC_SERVER_USERNAME,PATH,XDG_STATE_HOME,all_proxy,http_proxy,https_proxy,no_proxy",
		s.waitLog("daemon: env-names=", bootTimeout), "its bootstrap env, credentials and the egress proxy variables")
	password, err := os.ReadFile(pwFile)
	require.NoError(t, err)
	st, err := os.Stat(pwFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode())
	assert.Len(t, string(password), 43, "a generated 32-byte password")
	assert.Equal(t, sha(string(password)), s.waitLog("daemon: password-sha256=", bootTimeout), "the daemon got the generated password")

	for _, p := range []string{"oac-sandbox-io", "daemon"} {
		started := s.waitFor(isProcess(p, "started"), bootTimeout, p+" started")
		assert.Greater(t, started.PID, 1)
	}

	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
	assert.Equal(t, "terminated, draining", s.waitLog("sandbox-io: got ", time.Second))
	for _, p := range []string{"oac-sandbox-io", "daemon"} {
		exited := s.waitFor(isProcess(p, "exited"), time.Second, p+" exited")
		require.NotNil(t, exited.ExitCode, p)
		assert.Equal(t, 0, *exited.ExitCode, "%s exits 0 on SIGTERM and its code is reported", p)
	}

	// Secrets never leave the guest: not in any event, not in the logs.
	_, raw := s.allEvents()
	for _, line := range append(raw, s.stderr.String()) {
		assert.NotContains(t, line, string(password))
		assert.NotContains(t, line, linkCredential)
	}
}

func TestDaemonThatNeverGetsHealthyFailsByTheDeadline(t *testing.T) {
	needBwrap(t)
	b := contract("link.example.com", "--never-healthy")
	b.Health.Deadline = func() *bootstrap.Duration { d := bootstrap.Duration(time.Second); return &d }()
	s := startShim(t, sandboxSpec{bootstrap: encode(t, b), args: identityArgs()})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, `guest: daemon not healthy within 1s: tried GET http://127.0.0.1:4096/global/health with Basic auth as "runtime" every 100ms (3s per request)`)
	assert.Contains(t, failed.Message, "last: HTTP 503 Service Unavailable")
	s.exitFailed(api.CodeDaemonUnhealthy, 15*time.Second)
	all, _ := s.allEvents()
	for _, e := range all {
		assert.NotEqual(t, api.StateReady, e.State, "never ready")
	}
	// Stopped in order after the failure: both processes exited.
	s.waitFor(isProcess("daemon", "exited"), time.Second, "daemon exited")
	s.waitFor(isProcess("oac-sandbox-io", "exited"), time.Second, "oac-sandbox-io exited")
}

func TestDaemonKilledAfterReadyIsFailed(t *testing.T) {
	needBwrap(t)
	marker := fmt.Sprintf("kill-me-%d", time.Now().UnixNano())
	s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("link.example.com", "--marker", marker)), args: identityArgs()})
	s.waitState(api.StateReady, bootTimeout)
	var pids []int
	require.Eventually(t, func() bool { pids = hostProcs(marker); return len(pids) == 1 }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGKILL))
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Equal(t, "guest: daemon exited: killed by signal killed", failed.Message)
	exited := s.waitFor(isProcess("daemon", "exited"), time.Second, "daemon exit event")
	assert.Equal(t, "killed", exited.Signal)
	s.exitFailed(api.CodeDaemonFailed, 15*time.Second)
}

func TestCrashLoopingSandboxIOIsRestartedWithGrowingBackoff(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("crash-loop.link.example.com")), args: identityArgs()})
	s.waitState(api.StateReady, bootTimeout)
	// Delay n is drawn from [b, 1.5b) with b = 100ms * 2^n.
	bands := [][2]int64{{100, 150}, {200, 300}, {400, 600}}
	for i, band := range bands {
		r := s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Restarts == i+1 && e.RestartInMS > 0
		}, 10*time.Second, fmt.Sprintf("restart %d", i+1))
		assert.GreaterOrEqual(t, r.RestartInMS, band[0], "restart %d", i+1)
		assert.Less(t, r.RestartInMS, band[1], "restart %d", i+1)
		assert.Equal(t, fmt.Sprintf("restarting in %s", time.Duration(r.RestartInMS)*time.Millisecond), r.Message)
		s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Running != nil && *e.Running && e.Restarts == i+1
		}, 10*time.Second, fmt.Sprintf("start after restart %d", i+1))
	}
	all, _ := s.allEvents()
	exits := 0
	for _, e := range all {
		if isProcess("oac-sandbox-io", "exited")(e) {
			require.NotNil(t, e.ExitCode)
			assert.Equal(t, 1, *e.ExitCode)
			exits++
		}
	}
	assert.GreaterOrEqual(t, exits, 3, "every exit is an event")
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

func TestSandboxIOUsageExitIsFailedAndNotRestarted(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("usage.link.example.com")), args: identityArgs()})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, "guest: oac-sandbox-io exit status 2: not restarted")
	s.exitFailed(api.CodeSandboxIOFailed, 15*time.Second)
	all, _ := s.allEvents()
	for _, e := range all {
		assert.False(t, e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Restarts > 0, "no restart after exit 2")
	}
}

// volume returns a host directory the guest can use as its /home: writable
// by the guest's root (an unprivileged host id).
// bwrap resolves the path of the directory it binds as the guest's root, so
// every parent must be searchable by others: a directory right under
// os.TempDir, not t.TempDir (whose parent is 0700).
func volume(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "oac-e2e-home-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	require.NoError(t, os.Chmod(d, 0o777))
	return d
}

func TestStaleFileOnAPersistentHomeIsReplaced(t *testing.T) {
	needBwrap(t)
	home := volume(t)
	require.NoError(t, os.Mkdir(filepath.Join(home, "runtime"), 0o777))
	require.NoError(t, os.Chmod(filepath.Join(home, "runtime"), 0o777))
	stale := filepath.Join(home, "runtime", "sandbox-io-bootstrap.json")
	require.NoError(t, os.WriteFile(stale, []byte("stale from an earlier boot"), 0o644))
	b := contract("link.example.com")
	s := startShim(t, sandboxSpec{bootstrap: encode(t, b), args: append(identityArgs(), "--volume", "/home="+home)})
	s.waitState(api.StateReady, bootTimeout)
	want, err := b.SandboxIO.Bootstrap.Encode()
	require.NoError(t, err)
	got, err := os.ReadFile(stale)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
	st, err := os.Stat(stale)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode())
	ents, _ := os.ReadDir(filepath.Join(home, "runtime"))
	for _, e := range ents {
		assert.NotContains(t, e.Name(), ".tmp-", "no temporary file left")
	}
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
	_, err = os.Stat(stale)
	assert.NoError(t, err, "the file is kept for restarts")
}

func TestSymlinkPlantedAtTheFileIsRefusedAndItsTargetUntouched(t *testing.T) {
	needBwrap(t)
	home := volume(t)
	require.NoError(t, os.Mkdir(filepath.Join(home, "runtime"), 0o777))
	require.NoError(t, os.Chmod(filepath.Join(home, "runtime"), 0o777))
	victim := filepath.Join(home, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	// uid 1000 planted this between boots; it resolves inside the guest.
	require.NoError(t, os.Symlink("/home/victim", filepath.Join(home, "runtime", "sandbox-io-bootstrap.json")))
	symlinkRefused(t, home, victim, "/home/runtime/sandbox-io-bootstrap.json is a symbolic link")
}

func TestSymlinkPlantedAtHomeRuntimeIsRefusedAndItsTargetUntouched(t *testing.T) {
	needBwrap(t)
	home := volume(t)
	require.NoError(t, os.Mkdir(filepath.Join(home, "elsewhere"), 0o777))
	victim := filepath.Join(home, "elsewhere", "sandbox-io-bootstrap.json")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	require.NoError(t, os.Symlink("/home/elsewhere", filepath.Join(home, "runtime")))
	symlinkRefused(t, home, victim, "/home/runtime is a symbolic link")
}

func symlinkRefused(t *testing.T, home, victim, what string) {
	t.Helper()
	s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("link.example.com")), args: append(identityArgs(), "--volume", "/home="+home)})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, what)
	assert.Contains(t, failed.Message, "refused")
	s.exitFailed(api.CodeSandboxIOFailed, 15*time.Second)
	got, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(got), "the target is untouched")
	st, err := os.Stat(victim)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode())
	assert.Equal(t, uint32(0), st.Sys().(*syscall.Stat_t).Uid, "the target was not chowned")
	all, _ := s.allEvents()
	for _, e := range all {
		assert.NotEqual(t, api.KindProcess, e.Event, "no process was started")
	}
}

// TestEveryInvalidBootstrapRuleCreatesNothing runs oac-shim once per rule:
// each fails with the rule's message, creates no sandbox (no starting
// event, no state directory) and no password file.
func TestEveryInvalidBootstrapRuleCreatesNothing(t *testing.T) {
	needBwrap(t)
	mut := func(f func(b *bootstrap.Bootstrap)) func(*testing.T) string {
		return func(t *testing.T) string { b := contract("link.example.com"); f(b); return encode(t, b) }
	}
	raw := func(f func(doc string) string) func(*testing.T) string {
		return func(t *testing.T) string { return f(encode(t, contract("link.example.com"))) }
	}
	io := func(b *bootstrap.Bootstrap) *bootstrap.SandboxIO { return b.SandboxIO.Bootstrap }
	rows := []struct {
		name string
		doc  func(*testing.T) string
		args []string
		want error
	}{
		{"version", mut(func(b *bootstrap.Bootstrap) { b.Version = 2 }), nil, bootstrap.ErrVersion},
		{"hostname", mut(func(b *bootstrap.Bootstrap) { b.Hostname = "SECRET_host" }), nil, bootstrap.ErrHostname},
		{"stop grace", mut(func(b *bootstrap.Bootstrap) { d := bootstrap.Duration(time.Hour); b.StopGrace = &d }), nil, bootstrap.ErrStopGrace},
		{"no identity", mut(func(*bootstrap.Bootstrap) {}), []string{}, bootstrap.ErrNoIdentity},
		{"identity format", mut(func(*bootstrap.Bootstrap) {}), []string{"--tenant", "SECRET", "--environment", environmentID, "--allocation", allocationID}, bootstrap.ErrIdentity},
		{"hosted without sandbox_io", mut(func(b *bootstrap.Bootstrap) { b.SandboxIO = nil }), nil, bootstrap.ErrNoLink},
		{"sandbox_io path", mut(func(b *bootstrap.Bootstrap) { b.SandboxIO.Path = "SECRET/io" }), nil, bootstrap.ErrSandboxIOPath},
		{"sandbox_io source", mut(func(b *bootstrap.Bootstrap) { b.SandboxIO.Provided = true }), nil, bootstrap.ErrSandboxIOSource},
		{"sandbox_io version", mut(func(b *bootstrap.Bootstrap) { io(b).Version = 2 }), nil, bootstrap.ErrSandboxIOVersion},
		{"no link", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "" }), nil, bootstrap.ErrNoLink},
		{"link not TLS", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "ws://SECRET.example.com/" }), nil, bootstrap.ErrPublicURLUnreachable},
		{"link loopback", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss://127.0.0.1/SECRET" }), nil, bootstrap.ErrPublicURLUnreachable},
		{"link ws public in dev", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "ws://SECRET.example.com/" }), []string{"--allow-loopback-link"}, bootstrap.ErrLinkURLScheme},
		{"link scheme", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "https://SECRET.example.com/" }), nil, bootstrap.ErrLinkURLScheme},
		{"link user info", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss://SECRET@link.example.com/" }), nil, bootstrap.ErrLinkURLUserInfo},
		{"link query", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss://link.example.com/?SECRET" }), nil, bootstrap.ErrLinkURLQuery},
		{"link fragment", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss://link.example.com/#SECRET" }), nil, bootstrap.ErrLinkURLFragment},
		{"link whitespace", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss://link.example.com/ SECRET" }), nil, bootstrap.ErrLinkURLWhitespace},
		{"link host", mut(func(b *bootstrap.Bootstrap) { io(b).LinkURL = "wss:///SECRET" }), nil, bootstrap.ErrLinkURL},
		{"credential length", mut(func(b *bootstrap.Bootstrap) { io(b).Credential = "" }), nil, bootstrap.ErrCredentialLength},
		{"credential chars", mut(func(b *bootstrap.Bootstrap) { io(b).Credential = "SECRET with space" }), nil, bootstrap.ErrCredentialChars},
		{"tenant format", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.TenantID = "SECRET" }), nil, bootstrap.ErrTenantID},
		{"environment format", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.EnvironmentID = strings.ToUpper(environmentID) }), nil, bootstrap.ErrEnvironmentID},
		{"allocation format", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.ID = "00000000-0000-0000-0000-000000000000" }), nil, bootstrap.ErrAllocationID},
		{"kind", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.Kind = "enrollment" }), nil, bootstrap.ErrResourceKind},
		{"generation", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.Generation = 0 }), nil, bootstrap.ErrGeneration},
		{"another tenant", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.TenantID = otherID }), nil, bootstrap.ErrWrongTenant},
		{"another environment", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.EnvironmentID = otherID }), nil, bootstrap.ErrWrongEnvironment},
		{"another allocation", mut(func(b *bootstrap.Bootstrap) { io(b).Resource.ID = otherID }), nil, bootstrap.ErrWrongAllocation},
		{"argv", mut(func(b *bootstrap.Bootstrap) { b.Daemon.Argv[0] = "SECRET" }), nil, bootstrap.ErrArgv},
		{"env", mut(func(b *bootstrap.Bootstrap) { b.Daemon.Env = []string{"SECRET"} }), nil, bootstrap.ErrEnv},
		{"args size", mut(func(b *bootstrap.Bootstrap) { b.Daemon.Argv = append(b.Daemon.Argv, strings.Repeat("SECRET", 11000)) }), nil, bootstrap.ErrArgsSize},
		{"dir", mut(func(b *bootstrap.Bootstrap) { b.Daemon.Dir = "SECRET" }), nil, bootstrap.ErrDir},
		{"credentials without daemon", mut(func(b *bootstrap.Bootstrap) { b.Daemon, b.Health = nil, nil }), nil, bootstrap.ErrCredentialsNeedDaemon},
		{"username", mut(func(b *bootstrap.Bootstrap) { b.Credentials.Username = "SECRET:x" }), nil, bootstrap.ErrUsername},
		{"password", mut(func(b *bootstrap.Bootstrap) { b.Credentials.Password = "SECRET" }), nil, bootstrap.ErrPassword},
		{"credential env", mut(func(b *bootstrap.Bootstrap) { b.Daemon.Env = []string{"OAC_SERVER_PASSWORD=SECRET"} }), nil, bootstrap.ErrCredentialEnv},
		{"health without credentials", mut(func(b *bootstrap.Bootstrap) { b.Credentials = nil }), nil, bootstrap.ErrHealthNeedsCredentials},
		{"health port", mut(func(b *bootstrap.Bootstrap) { b.Health.Port = 0 }), nil, bootstrap.ErrHealthPort},
		{"health path", mut(func(b *bootstrap.Bootstrap) { b.Health.Path = "SECRET" }), nil, bootstrap.ErrHealthPath},
		{"health interval", mut(func(b *bootstrap.Bootstrap) { d := bootstrap.Duration(time.Hour); b.Health.Interval = &d }), nil, bootstrap.ErrHealthInterval},
		{"health timeout", mut(func(b *bootstrap.Bootstrap) { d := bootstrap.Duration(time.Hour); b.Health.Timeout = &d }), nil, bootstrap.ErrHealthTimeout},
		{"health deadline", mut(func(b *bootstrap.Bootstrap) { d := bootstrap.Duration(time.Hour); b.Health.Deadline = &d }), nil, bootstrap.ErrHealthDeadline},
		{"sandbox_io duplicate key", raw(func(d string) string {
			return strings.Replace(d, `"credential":"`, `"credential":"SECRET","credential":"`, 1)
		}), nil, bootstrap.ErrSandboxIODuplicateKey},
		{"sandbox_io case-variant key", raw(func(d string) string { return strings.Replace(d, `"link_url"`, `"Link_Url"`, 1) }), nil, bootstrap.ErrSandboxIOKeyCase},
		{"sandbox_io unknown key", raw(func(d string) string { return strings.Replace(d, `"link_url"`, `"SECRET":1,"link_url"`, 1) }), nil, bootstrap.ErrSandboxIOUnknownKey},
		{"sandbox_io missing key", raw(func(d string) string { return strings.Replace(d, `,"generation":3`, ``, 1) }), nil, bootstrap.ErrSandboxIOMissingKey},
		{"sandbox_io wrong type", raw(func(d string) string { return strings.Replace(d, `"generation":3`, `"generation":"3"`, 1) }), nil, bootstrap.ErrSandboxIOType},
		{"sandbox_io too large", raw(func(d string) string {
			return strings.Replace(d, `"link_url"`, strings.Repeat(" ", 16<<10)+`"link_url"`, 1)
		}), nil, bootstrap.ErrSandboxIOTooLarge},
		{"duplicate key", raw(func(d string) string {
			return strings.Replace(d, `"hostname":"contract"`, `"hostname":"contract","hostname":"x"`, 1)
		}), nil, bootstrap.ErrDuplicateKey},
		{"case-variant key", raw(func(d string) string { return strings.Replace(d, `"hostname"`, `"HostName"`, 1) }), nil, bootstrap.ErrUnknownKey},
		// Only the operator's --allow-loopback-link relaxes the Link rule.
		{"allow_loopback_link in the document", raw(func(d string) string {
			return strings.Replace(d, `"version":1,`, `"version":1,"sandbox":{"tenant_id":"`+tenantID+`","environment_id":"`+environmentID+
				`","allocation_id":"`+allocationID+`","allow_loopback_link":true},`, 1)
		}), nil, bootstrap.ErrUnknownKey},
		{"trailing data", raw(func(d string) string { return d + `{"SECRET":1}` }), nil, bootstrap.ErrDecode},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			args := r.args
			if args == nil {
				args = identityArgs()
			} else if len(args) > 0 && args[0] == "--allow-loopback-link" {
				args = append(identityArgs(), args...)
			} else if len(args) > 0 {
				args = append(args, "--sandbox-io", bins.sandboxIO)
			}
			pwFile := filepath.Join(t.TempDir(), "password")
			s := startShim(t, sandboxSpec{bootstrap: r.doc(t), args: append(args, "--password-file", pwFile)})
			failed := s.waitState(api.StateFailed, 10*time.Second)
			assert.Contains(t, failed.Message, "nothing created")
			assert.Contains(t, failed.Message+s.stderr.String(), r.want.Error())
			assert.NotContains(t, failed.Message+s.stderr.String(), "SECRET", "messages never echo submitted values")
			s.exitFailed(bootstrapCode(r.want), 10*time.Second)
			all, _ := s.allEvents()
			assert.Len(t, all, 1, "only the failed event: no sandbox was started")
			_, err := os.Stat(filepath.Join("/run/oac/sandboxes", s.name))
			assert.True(t, os.IsNotExist(err), "no state directory")
			_, err = os.Stat(pwFile)
			assert.True(t, os.IsNotExist(err), "no password file")
		})
	}
}

// bootstrapCode is the failure code an invalid bootstrap breaking rule
// gets: the Link rules have codes of their own (the node provider's 409
// configuration error), every other rule is invalid_bootstrap.
func bootstrapCode(rule error) string {
	switch rule {
	case bootstrap.ErrNoLink:
		return api.CodeNoLink
	case bootstrap.ErrPublicURLUnreachable:
		return api.CodePublicURLUnreachable
	}
	return api.CodeInvalidBootstrap
}

// The operator's --allow-loopback-link reaches the guest through Welcome:
// the guest, which validates the bootstrap again, accepts a ws:// Link URL
// on loopback and the sandbox becomes ready.
func TestTheOperatorsLoopbackLinkFlagReachesTheGuest(t *testing.T) {
	needBwrap(t)
	b := contract("link.example.com")
	b.SandboxIO.Bootstrap.LinkURL = "ws://127.0.0.1:9/api/v1/sandbox-link"
	s := startShim(t, sandboxSpec{bootstrap: encode(t, b), args: append(identityArgs(), "--allow-loopback-link")})
	s.waitState(api.StateReady, bootTimeout)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
