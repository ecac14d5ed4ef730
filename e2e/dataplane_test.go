//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// ioBytes returns the bytes pid moved through read(2) and write(2) so far
// (rchar + wchar of /proc/PID/io); splice(2) moves none.
func ioBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	require.NoError(t, err)
	var n int64
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		if k == "rchar" || k == "wchar" {
			x, _ := strconv.ParseInt(v, 10, 64)
			n += x
		}
	}
	return n
}

// procComm returns pid's command name.
func procComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// guestAgent returns the host pid of the sandbox's oac-guest.
func guestAgent(t *testing.T, s *shim) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		for _, p := range descendants(s.cmd.Process.Pid) {
			if procComm(p) == "oac-guest" {
				pid = p
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the guest agent among the shim's descendants")
	return pid
}

// dataPlaneCase is one provider and setting the data plane is proved on.
type dataPlaneCase struct {
	name  string
	spec  sandboxSpec
	need  func(t *testing.T)
	log   string // a line of the guest's log that names the carrier in use
	moves bool   // bytes pass through the processes' own read and write calls (the session)
	// hands: the fd channel takes the workload's own sockets (the guest
	// hands each client's socket to the host, which carries it alone).
	hands bool
}

func dataPlaneCases() []dataPlaneCase {
	root := func(t *testing.T) { needBwrap(t); needCurl(t) }
	return []dataPlaneCase{
		// The handed path on the fd channel: direct mode, the default
		// where it holds, would take the raw connects before the capture.
		{name: "bwrap_fd_channel", spec: sandboxSpec{args: []string{"--data-plane", "fd"}}, need: root, log: "data plane: fd channel up", hands: true},
		{name: "bwrap_dialed", spec: sandboxSpec{args: []string{"--data-plane", "dial"}}, need: root, log: "data plane: data connections"},
		{name: "bwrap_rootless", spec: sandboxSpec{user: subIDUser}, need: func(t *testing.T) { needRootless(t); needCurl(t) }, log: "data plane: hand-only fd channel up", hands: true},
		{name: "oci_runc", spec: sandboxSpec{provider: "oci", args: []string{"--runtime", "runc", "--data-plane", "fd"}}, need: func(t *testing.T) { needOCI(t, "runc"); needCurl(t) }, log: "data plane: fd channel up", hands: true},
		{name: "oci_crun", spec: sandboxSpec{provider: "oci", args: []string{"--runtime", "crun", "--data-plane", "fd"}}, need: func(t *testing.T) { needOCI(t, "crun"); needCurl(t) }, log: "data plane: fd channel up", hands: true},
		{name: "session_only", spec: sandboxSpec{args: []string{"--data-plane", "off"}}, need: root, moves: true},
	}
}

// Egress through the proxy and the capture moves every byte, with the same
// events as ever; on the data plane neither the shim nor the guest agent
// reads or writes the bytes (the kernel splices them on both sides), over
// the session both do.
func TestDataPlaneCarriesEgressInTheKernelOnBothSides(t *testing.T) {
	const size = 32 << 20
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	want := sha256.Sum256(payload)
	wantHex := hex.EncodeToString(want[:])
	ln := listen(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			h := sha256.New()
			_, _ = io.Copy(h, r.Body)
			fmt.Fprint(w, hex.EncodeToString(h.Sum(nil)))
			return
		}
		_, _ = w.Write(payload)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	script := `
echo armed
sleep 1
# Through the HTTP proxy's CONNECT tunnel, then captured transparently.
P="-p -x http://127.0.0.1:3128"
p=$(curl -sS -m 60 $P http://up.test/dl | sha256sum | cut -c1-64)
pu=$(curl -sS -m 60 $P http://up.test/dl | curl -sS -m 60 $P --data-binary @- http://up.test/ul)
c=$(curl -sS -m 60 --noproxy '*' http://up.test/dl | sha256sum | cut -c1-64)
cu=$(curl -sS -m 60 --noproxy '*' http://up.test/dl | curl -sS -m 60 --noproxy '*' --data-binary @- http://up.test/ul)
echo "sums $p $c $pu $cu"
exec sleep 1000
`
	for _, tc := range dataPlaneCases() {
		t.Run(tc.name, func(t *testing.T) {
			tc.need(t)
			spec := tc.spec
			// Per path: a download, and a download piped into an upload.
			const conns = 6
			spec.bootstrap = egressBootstrap(script)
			spec.args = append(spec.args, "--upstream", fmt.Sprintf("up.test:80=127.0.0.1:%d", portOf(ln)))
			s := startShim(t, spec)
			s.waitState(api.StateReady, bootTimeout)
			s.waitLog("armed", bootTimeout)
			agent := guestAgent(t, s)
			shimBefore, agentBefore := ioBytes(t, s.cmd.Process.Pid), ioBytes(t, agent)
			sums := strings.Fields(s.waitLog("sums ", 2*time.Minute))
			shimMoved, agentMoved := ioBytes(t, s.cmd.Process.Pid)-shimBefore, ioBytes(t, agent)-agentBefore
			t.Logf("%s: read+write calls moved %d MiB in the shim, %d MiB in the guest agent, for %d x %d MiB carried",
				tc.name, shimMoved>>20, agentMoved>>20, conns, size>>20)
			require.Equal(t, []string{wantHex, wantHex, wantHex, wantHex}, sums, "every byte arrived, both ways, on both paths")
			if tc.moves {
				assert.Greater(t, shimMoved, int64(conns*size), "over the session the shim copies each byte")
				assert.Greater(t, agentMoved, int64(conns*size), "and so does the guest agent")
			} else {
				assert.Less(t, shimMoved, int64(size), "the shim copied none of the bytes")
				assert.Less(t, agentMoved, int64(size), "the guest agent copied none of the bytes")
			}
			if tc.log != "" {
				assert.Contains(t, s.stderr.String(), tc.log, "the guest names its carrier")
			}
			if tc.hands {
				assert.Contains(t, s.stderr.String(), "handing=true", "the host takes the workload's own sockets")
			}
			// The events are the session's: one decision and one close per
			// connection, with the bytes each way.
			closedEvents := func() []api.Event { return s.find(func(e api.Event) bool { return e.Event == api.KindEgressClosed }) }
			require.Eventually(t, func() bool { return len(closedEvents()) == conns }, 10*time.Second, 20*time.Millisecond,
				"one close event per connection (each is emitted when its last byte has crossed)")
			allowed := s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Decision == "allowed" && e.Via != "dns" })
			closed := closedEvents()
			require.Len(t, allowed, conns)
			var in, out int64
			for _, e := range closed {
				in += *e.BytesIn
				out += *e.BytesOut
				assert.Empty(t, e.Code, "each closed cleanly")
			}
			assert.InDelta(t, int64(conns/3*2*size), in, 64<<10, "the downloads' bodies and heads, counted on the data plane as on the session")
			assert.GreaterOrEqual(t, out, int64(conns/3*size), "the uploads' bytes and the requests")
			vias := map[string]int{}
			for _, e := range allowed {
				vias[e.Via]++
			}
			assert.Equal(t, 3, vias["connect"])
			assert.Equal(t, 3, vias["transparent"])
			s.signal(syscall.SIGTERM)
			assert.Equal(t, 0, s.exit(15*time.Second))
			assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
		})
	}
}
