//go:build linux

package e2e

// Load at CI scale (make test): one guest with OAC_LOAD_CONNS (100)
// concurrent egress connections moving checksummed bytes both ways, and
// OAC_LOAD_GUESTS (10) bwrap guests started at once. make bench runs the
// same tests at full scale (1,000 connections, 50 guests) and keeps the
// figures they log (lines starting "LOAD"). No timing is asserted.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// payload is the deterministic download for connection i.
func payload(i, size int) []byte {
	b := make([]byte, size)
	rand.New(rand.NewSource(int64(i))).Read(b)
	return b
}

// rssKB returns the resident set of pid in KiB (0 if gone).
func rssKB(pid int) int { return statusKB(pid, "VmRSS:") }

// statusKB returns a KiB field of /proc/PID/status (0 if gone).
func statusKB(pid int, field string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			f := strings.Fields(v)
			n, _ := strconv.Atoi(f[0])
			return n
		}
	}
	return 0
}

func TestLoadManyConcurrentEgressConnectionsMoveEveryByte(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	conns := envInt("OAC_LOAD_CONNS", 100)
	size := envInt("OAC_LOAD_SIZE", 256<<10)
	ln := listen(t)
	var got sync.Map // connection -> sha of what was uploaded
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/dl/")); err == nil {
			_, _ = w.Write(payload(i, size))
			return
		}
		h := sha256.New()
		_, _ = io.Copy(h, r.Body)
		sum := hex.EncodeToString(h.Sum(nil))
		got.Store(r.URL.Path, sum)
		fmt.Fprint(w, sum)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	// The workload may run at most 128 processes (docs/workload.md), so one
	// curl per direction holds all N connections at once (--parallel)
	// rather than a process per connection.
	script := fmt.Sprintf(`
N=%d; SIZE=%d
head -c $SIZE /dev/urandom > up
echo "expect-up $(sha256sum up | cut -c1-64)"
curl -sS --max-time 300 --parallel --parallel-immediate --parallel-max $N "http://up.test/dl/[1-$N]" -o "dl.#1"
curl -sS --max-time 300 --parallel --parallel-immediate --parallel-max $N --data-binary @up "http://up.test/ul/[1-$N]" -o "ul.#1"
for i in $(seq $N); do
  d=$(sha256sum < dl.$i | cut -c1-64); u=; read -r u < ul.$i
  echo "conn $i $d $u"
done
echo "load done"
exec sleep 100000`, conns, size)
	start := time.Now()
	s := startShim(t, sandboxSpec{
		bootstrap: egressBootstrap(script),
		args: []string{"--upstream", fmt.Sprintf("up.test:80=127.0.0.1:%d", portOf(ln)),
			"--egress-max-streams", strconv.Itoa(2*conns + 16)},
	})
	s.waitState(api.StateReady, bootTimeout)
	expectUp := s.waitLog("expect-up ", bootTimeout)
	s.waitLog("load done", 10*time.Minute)
	took := time.Since(start)
	peak := statusKB(s.cmd.Process.Pid, "VmHWM:") // the shim's peak resident set
	ok := 0
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "conn ") }) {
		f := strings.Fields(e.Line)
		require.Len(t, f, 4, e.Line)
		i, _ := strconv.Atoi(f[1])
		want := sha256.Sum256(payload(i, size))
		assert.Equal(t, hex.EncodeToString(want[:]), f[2], "download %d arrived whole", i)
		assert.Equal(t, expectUp, f[3], "upload %d arrived whole", i)
		if v, _ := got.Load("/ul/" + f[1]); v == expectUp && f[2] == hex.EncodeToString(want[:]) {
			ok++
		}
	}
	assert.Equal(t, conns, ok, "every connection moved every byte both ways")
	closed := s.find(func(e api.Event) bool { return e.Event == api.KindEgressClosed })
	var in, out int64
	for _, e := range closed {
		in += *e.BytesIn
		out += *e.BytesOut
	}
	assert.Len(t, closed, 2*conns, "one closed event per connection")
	assert.Empty(t, s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Decision != "allowed" }))
	t.Logf("LOAD egress: %d concurrent connections x %d KiB down and up: all %d checksums match; %d MiB in, %d MiB out through the broker; shim peak RSS %d KiB; %s from start to all done",
		conns, size>>10, ok, in>>20, out>>20, peak, took.Round(time.Millisecond))
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(30*time.Second))
	assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
}

func TestLoadManyGuestsStartedAtOnce(t *testing.T) {
	needBwrap(t)
	n := envInt("OAC_LOAD_GUESTS", 10)
	start := time.Now()
	shims := make([]*shim, n)
	for i := range shims {
		shims[i] = startShim(t, sandboxSpec{name: uniqueName("load"), bootstrap: daemon("exec sleep 100000")})
	}
	for _, s := range shims {
		s.waitState(api.StateReady, 5*time.Minute)
	}
	allReady := time.Since(start)
	time.Sleep(300 * time.Millisecond) // settle
	var shimKB, totalKB int
	for _, s := range shims {
		shimKB += rssKB(s.cmd.Process.Pid)
		totalKB += rssKB(s.cmd.Process.Pid)
		for _, p := range descendants(s.cmd.Process.Pid) {
			totalKB += rssKB(p)
		}
	}
	t.Logf("LOAD guests: %d bwrap guests started at once, all ready in %s; memory per sandbox (RSS of shim + bwrap + guest + daemon): %.1f MiB, of which the shim %.1f MiB",
		n, allReady.Round(time.Millisecond), float64(totalKB)/float64(n)/1024, float64(shimKB)/float64(n)/1024)
	for _, s := range shims {
		s.signal(syscall.SIGTERM)
	}
	for _, s := range shims {
		assert.Equal(t, 0, s.exit(60*time.Second))
		assert.Equal(t, api.StateStopped, s.lastEvent().State)
		assertNothingLeft(t, s.name, []int{s.cmd.Process.Pid})
	}
}
