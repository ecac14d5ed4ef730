//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/unprivuser"
)

// Unprivileged users the rootless scenarios run the shim as.
const (
	subIDUser  = "oac-e2e-subids"
	singleUser = "oac-e2e-single"
)

var usersOnce sync.Once
var usersErr error

// needRootless creates (once) a user with a subordinate id range and one
// without, as a desktop Linux machine would have them.
func needRootless(t *testing.T) {
	t.Helper()
	needBwrap(t)
	for _, tool := range []string{"newuidmap", "newgidmap", "setpriv", "useradd", "usermod"} {
		_, err := exec.LookPath(tool)
		need(t, err == nil, tool+" is missing: apt-get install uidmap passwd util-linux (or run make deps)")
	}
	usersOnce.Do(func() { usersErr = createUsers() })
	require.NoError(t, usersErr)
}

func createUsers() error {
	if err := unprivuser.Ensure(subIDUser, true); err != nil {
		return err
	}
	return unprivuser.Ensure(singleUser, false)
}

// subIDStart returns the first subordinate uid of name.
func subIDStart(name string) (int, error) { return unprivuser.SubIDStart(name) }

func lookupUID(t *testing.T, name string) int {
	t.Helper()
	u, err := user.Lookup(name)
	require.NoError(t, err)
	uid, err := strconv.Atoi(u.Uid)
	require.NoError(t, err)
	return uid
}

func TestRootlessCheckExplainsMissingSubordinateIDs(t *testing.T) {
	needRootless(t)
	out, err := exec.Command("setpriv", "--reuid", singleUser, "--regid", singleUser, "--init-groups", "--reset-env", bins.shim, "check").CombinedOutput()
	require.Error(t, err, "check fails when no provider is available")
	assert.Contains(t, string(out), "has no subordinate id range")
	assert.Contains(t, string(out), "usermod --add-subuids")
	assert.Contains(t, string(out), "--single-uid")

	out, err = exec.Command("setpriv", "--reuid", subIDUser, "--regid", subIDUser, "--init-groups", "--reset-env", bins.shim, "check").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "bwrap: available (rootless")
}

func TestRootlessGuestMapsUID1000ToASubordinateID(t *testing.T) {
	needRootless(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{user: subIDUser, bootstrap: daemon(
		`echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; exec ` + marker)})
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "1000 gid=1000 groups=1000", s.waitLog("uid=", bootTimeout))

	var pids []int
	require.Eventually(t, func() bool { pids = hostProcs(marker); return len(pids) == 1 }, 5*time.Second, 20*time.Millisecond)
	start, err := subIDStart(subIDUser)
	require.NoError(t, err)
	uids := procStatus(t, pids[0], "Uid")
	assert.Equal(t, strconv.Itoa(start+999), uids[0], "guest uid 1000 is subordinate id 999 of the user")
	agentPID, err := strconv.Atoi(procStatus(t, pids[0], "PPid")[0])
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(lookupUID(t, subIDUser)), procStatus(t, agentPID, "Uid")[0], "guest root is the user")

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
	assert.Empty(t, hostProcs(marker), "nothing left behind")
	_, err = os.Stat(filepath.Join("/tmp", fmt.Sprintf("oac-%d", lookupUID(t, subIDUser)), "sandboxes", s.name))
	assert.True(t, os.IsNotExist(err), "the state directory is removed")
}

func TestRootlessWithoutSubordinateIDsRefusesUnlessSingleUIDIsAsked(t *testing.T) {
	needRootless(t)
	refused := startShim(t, sandboxSpec{user: singleUser, bootstrap: daemon("exec sleep 1000")})
	failed := refused.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, "no subordinate id range")
	refused.exitFailed(api.CodeProviderUnavailable, 10*time.Second)

	s := startShim(t, sandboxSpec{user: singleUser, args: []string{"--single-uid"}, bootstrap: daemon(`echo "uid=$(id -u)"; exec sleep 1000`)})
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "1000", s.waitLog("uid=", bootTimeout))
	assert.Contains(t, s.stderr.String(), "single-uid mode: guest uid 1000 is your own host uid", "the loss is said plainly")
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestRootlessBootContractWritesThePrivateFileAndRunsBothProcessesOnSubordinateIDs(t *testing.T) {
	needRootless(t)
	b := contract("link.example.com")
	s := startShim(t, sandboxSpec{user: subIDUser, bootstrap: encode(t, b), args: identityArgs()})
	ready := s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "runtime", ready.Username)

	// The private file, as seen inside, is exactly as when the shim is root.
	assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", s.waitLog("sandbox-io: file=", bootTimeout))
	assert.Equal(t, "mode=0700 uid=1000 gid=1000", s.waitLog("sandbox-io: dir=", bootTimeout))
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("sandbox-io: ids=", bootTimeout))
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", bootTimeout))

	// Both processes run as subordinate id 999 of the user on the host.
	start, err := subIDStart(subIDUser)
	require.NoError(t, err)
	var pids []int
	require.Eventually(t, func() bool { pids = s.procs("oac-daemon-standin serve"); return len(pids) == 1 }, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, strconv.Itoa(start+999), procStatus(t, pids[0], "Uid")[0])

	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
	assert.Eventually(t, func() bool { _, err := os.Stat(fmt.Sprintf("/proc/%d", pids[0])); return os.IsNotExist(err) }, 5*time.Second, 20*time.Millisecond,
		"nothing left behind")
}

func TestRootlessEgressAllowsAndDeniesAsWhenRoot(t *testing.T) {
	needRootless(t)
	needCurl(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s%s", r.Host, r.URL.Path)
	}))
	defer web.Close()
	script := `
echo "allowed: $(curl -sS -m 10 http://web.test/page 2>&1)"
echo "denied: $(curl -sS -m 10 -o /dev/null -w '%{http_code}' http://blocked.test/ 2>&1)"
exec sleep 1000
`
	s := startShim(t, sandboxSpec{user: subIDUser, bootstrap: egressBootstrap(script),
		args: []string{"--upstream", "web.test:80=" + web.Listener.Addr().String()}})
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "hello from web.test/page", s.waitLog("allowed: ", 30*time.Second))
	assert.Equal(t, "403", s.waitLog("denied: ", 30*time.Second), "the explicit denial")
	denied := s.waitFor(func(e api.Event) bool { return e.Event == "egress" && e.Decision == "denied" }, 10*time.Second, "denied egress event")
	assert.Contains(t, denied.Target, "blocked.test")
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
