package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oac/sandbox-agent/api"
)

func TestZZSpeedProbe(t *testing.T) {
	ln := listen(t)
	payload := make([]byte, 256<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(payload) })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	script := `
echo armed
sleep 2
grep -E 'Seccomp|Speculation' /proc/self/status | tr '\n' ' '; echo
for i in $(seq 1 30); do echo "speed $(curl -sS -m 60 --noproxy '*' -o /dev/null -w '%{speed_download}' http://up.test/dl)"; done
echo done-all
exec sleep 1000
`
	for _, tc := range []struct{ name, user string; args []string }{
		{"root", "", []string{"--data-plane", "fd"}},
		{"rootless", subIDUser, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := sandboxSpec{user: tc.user, args: append(tc.args, "--upstream", fmt.Sprintf("up.test:80=127.0.0.1:%d", portOf(ln)))}
			spec.bootstrap = egressBootstrap(script)
			s := startShim(t, spec)
			s.waitState(api.StateReady, bootTimeout)
			s.waitLog("armed", bootTimeout)
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
			for _, l := range strings.Split(string(st), "\n") {
				if strings.HasPrefix(l, "Seccomp") || strings.HasPrefix(l, "Specul") || strings.HasPrefix(l, "Uid") || strings.HasPrefix(l, "Name") {
					t.Logf("shim %s", l)
				}
			}
			agent := guestAgent(t, s)
			sc := exec.Command("timeout", "-s", "INT", "3", "strace", "-f", "-c", "-p", fmt.Sprint(agent))
			so, _ := sc.CombinedOutput()
			t.Logf("%s agent strace -c:\n%s", tc.name, so)
			data := "/tmp/perf-" + tc.name + ".data"
			pr := exec.Command("perf", "record", "-o", data, "-a", "-g", "--", "sleep", "2")
			_ = pr.Run()
			rep, _ := exec.Command("perf", "report", "-i", data, "--no-children", "--sort", "comm", "--stdio").CombinedOutput()
			t.Logf("%s perf by comm:\n%s", tc.name, rep)
			pc := exec.Command("perf", "stat", "-e", "context-switches,cpu-migrations,task-clock", "-a", "sleep", "1")
			out, _ := pc.CombinedOutput()
			s.waitLog("done-all", 2*time.Minute)
			for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog }) {
				t.Logf("%s: log %s", tc.name, e.Line)
			}
			for _, l := range strings.Split(s.stderr.String(), "\n") {
				if strings.Contains(l, "speed") || strings.Contains(l, "done-all") || strings.Contains(l, "curl") || strings.Contains(l, "Seccomp") || strings.Contains(l, "data plane") {
					t.Logf("%s: %s", tc.name, l)
				}
			}
			t.Logf("perf: %s", out)
			s.signal(syscall.SIGTERM)
			s.exit(15 * time.Second)
		})
	}
}
