//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// probe is one client run in the guest: a label and its argv.
type probe struct {
	label string
	argv  []string
}

// probeScript renders probes as a bash script printing "label: OUTPUT"
// (newlines as '|') each and then "probes done", as vmdaemon does.
func probeScript(ps []probe) string {
	var b strings.Builder
	for _, p := range ps {
		q := make([]string, len(p.argv))
		for i, a := range p.argv {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		fmt.Fprintf(&b, "out=$(%s 2>&1); echo \"%s: ${out//$'\\n'/|}\"\n", strings.Join(q, " "), p.label)
	}
	b.WriteString("echo 'probes done'\nexec sleep 1000\n")
	return b.String()
}

// egressPromises is one run of the promises on a provider: a name
// allowed by a wildcard rule flips from an allowed address to this
// host's own address between two connections (the second is refused and
// reaches nothing); curl --socks5, which resolves the name in the guest,
// reaches an allowed name; curl --noproxy '*' to a name whose port 80 the
// policy refuses prints the proxy's 403 explanation.
type egressPromises struct {
	t        *testing.T
	port     int
	reached  atomic.Int32
	own      string
	args     []string
	files    map[string]string
	probes   []probe
	upstream string
}

func newEgressPromises(t *testing.T) *egressPromises {
	e := &egressPromises{t: t}
	// A service the host runs on every address: the attacker's target.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.reached.Add(1)
		fmt.Fprintf(w, "reached %s", r.Host)
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	e.port = portOf(ln)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain hello from %s%s", r.Host, r.URL.Path)
	}))
	t.Cleanup(web.Close)
	e.upstream = web.Listener.Addr().String()

	// This host's own address, and a CIDR rule for its subnet: the rule
	// lifts its class (documentation, private, ...), so only the host
	// address check stands between the guest and the service.
	subnet := ""
	if e.own = hostIPv4(); e.own != "" {
		subnet = netip.PrefixFrom(netip.MustParseAddr(e.own), 24).Masked().String()
	} else {
		e.own, subnet = "127.0.0.2", "127.0.0.0/8"
	}
	own := netip.MustParseAddr(e.own).As4()
	dns := startDNSAnswering(t, func(name string, asked int) ([4]byte, bool) {
		switch name {
		case "flip.rebind.test":
			if asked == 0 {
				return [4]byte{127, 0, 0, 1}, true
			}
			return own, true
		case "denied.example":
			return [4]byte{93, 184, 216, 34}, true
		}
		return [4]byte{}, false
	})
	e.files = map[string]string{"/etc/resolv.conf": "nameserver " + dns.addr + "\n"}
	p := fmt.Sprint(e.port)
	e.args = []string{
		"--allow", "*.rebind.test:" + p,
		"--allow", "127.0.0.1/32:" + p,
		"--allow", subnet + ":" + p,
		"--allow", "denied.example:443",
		"--upstream", "web.test:80=" + e.upstream,
	}
	url := "http://flip.rebind.test:" + p + "/"
	e.probes = []probe{
		{"first", []string{"curl", "-sS", "-m", "10", url}},
		{"second", []string{"curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", url}},
		{"socks", []string{"curl", "-sS", "-m", "10", "--socks5", "127.0.0.1:1080", "http://web.test/socks"}},
		{"noproxy", []string{"curl", "-sS", "-m", "10", "--noproxy", "*", "http://denied.example/"}},
	}
	return e
}

// check waits for the probes and asserts every promise.
func (e *egressPromises) check(s *shim, timeout time.Duration) {
	t := e.t
	s.waitFor(func(ev api.Event) bool {
		return ev.Event == api.KindState && strings.Contains(ev.Message, "transparent egress:")
	}, timeout, "transparent egress started")
	s.waitLog("probes done", timeout)
	p := fmt.Sprint(e.port)

	assert.Equal(t, "reached flip.rebind.test:"+p, s.logLine("first: "), "the first connection, to 127.0.0.1, is allowed by its rule")
	assert.Equal(t, "403", s.logLine("second: "), "the name flipped to this host's own address")
	assert.Equal(t, int32(1), e.reached.Load(), "the second connection reached nothing")
	// The host emits each decision after its answer: wait for the events.
	isFlip := func(ev api.Event) bool { return ev.Event == api.KindEgress && ev.Target == "flip.rebind.test:"+p }
	s.waitFor(func(ev api.Event) bool { return isFlip(ev) && ev.Decision == "denied" }, 10*time.Second, "the second connection's event")
	flips := s.find(isFlip)
	if assert.Len(t, flips, 2) {
		assert.Equal(t, "allowed", flips[0].Decision)
		assert.Equal(t, "127.0.0.1:"+p, flips[0].Address)
		assert.Equal(t, "denied", flips[1].Decision)
		assert.Contains(t, flips[1].Reason, "flip.rebind.test resolves to "+e.own+", which is an address of this host")
	}

	assert.Equal(t, "plain hello from web.test/socks", s.logLine("socks: "), "curl --socks5 resolved the name in the guest")
	socks := s.waitFor(func(ev api.Event) bool { return ev.Event == api.KindEgress && ev.Via == "socks5" }, 10*time.Second, "the SOCKS event")
	assert.Equal(t, "web.test:80", socks.Target, "the guest named the name, not its made-up address")
	assert.Equal(t, "allowed", socks.Decision)

	noproxy := s.logLine("noproxy: ")
	assert.Contains(t, noproxy, "Blocked by the sandbox's egress policy: this is not a network fault.")
	assert.Contains(t, noproxy, "The sandbox host refused the connection to denied.example:80.")
	assert.Contains(t, noproxy, "Reason: port 80 is not allowed for denied.example (its rule allows port 443); nothing was resolved")
	captured := s.waitFor(func(ev api.Event) bool {
		return ev.Event == api.KindEgress && ev.Via == "transparent" && ev.Target == "denied.example:80"
	}, 10*time.Second, "the captured connection's event")
	assert.Equal(t, "denied", captured.Decision)
	assert.Equal(t, "denied.example:443", captured.Rule)
}

// spec runs the probes in bwrap as root, on the capture (the handed
// path), not direct mode, whose refusals are the connect's own error.
func (e *egressPromises) spec() sandboxSpec {
	return sandboxSpec{bootstrap: egressBootstrap(probeScript(e.probes)), args: append([]string{"--data-plane", "fd"}, e.args...), files: e.files}
}

func TestEgressPromisesOnBwrap(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	needUnshare(t)
	e := newEgressPromises(t)
	s := startShim(t, e.spec())
	e.check(s, bootTimeout+30*time.Second)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestEgressPromisesOnRootlessBwrap(t *testing.T) {
	needRootless(t)
	needCurl(t)
	needUnshare(t)
	e := newEgressPromises(t)
	spec := e.spec()
	spec.user = subIDUser
	s := startShim(t, spec)
	e.check(s, bootTimeout+30*time.Second)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestEgressPromisesOnOCI(t *testing.T) {
	for _, rt := range ociRuntimes {
		t.Run(rt, func(t *testing.T) {
			needOCI(t, rt)
			needCurl(t)
			needUnshare(t)
			e := newEgressPromises(t)
			spec := e.spec()
			spec.provider = "oci"
			spec.args = append(spec.args, "--runtime", rt)
			s := startShim(t, spec)
			e.check(s, bootTimeout+30*time.Second)
			s.signal(syscall.SIGTERM)
			assert.Equal(t, 0, s.exit(15*time.Second))
		})
	}
}

// curlImage is the VM test initramfs plus curl and the libraries it
// loads (ldd), built once: the VM has no shell, so vmdaemon runs it.
var curlImage struct {
	once sync.Once
	path string
	err  error
}

func vmImageWithCurl(t *testing.T) string {
	t.Helper()
	curlImage.once.Do(func() {
		curl, err := exec.LookPath("curl")
		if err != nil {
			curlImage.err = err
			return
		}
		out, err := exec.Command("ldd", curl).Output()
		if err != nil {
			curlImage.err = fmt.Errorf("ldd %s: %w", curl, err)
			return
		}
		args := []string{"initramfs", "--agent", bins.guest, "--kernel-modules", kernelCache() + "/modules",
			"--file", bins.vmdaemon + ":" + vmDaemon, "--file", curl + ":/usr/bin/curl:0755"}
		lib := regexp.MustCompile(`(/\S+) \(0x`)
		for _, m := range lib.FindAllStringSubmatch(string(out), -1) {
			real, err := filepath.EvalSymlinks(m[1])
			if err != nil {
				curlImage.err = err
				return
			}
			args = append(args, "--file", real+":"+m[1]+":0755")
		}
		curlImage.path = filepath.Join(bins.dir, "initramfs-curl.img")
		args = append(args, "-o", curlImage.path)
		if out, err := exec.Command(bins.image, args...).CombinedOutput(); err != nil {
			curlImage.err = fmt.Errorf("oac-image: %v: %s", err, out)
		}
	})
	require.NoError(t, curlImage.err)
	return curlImage.path
}

func TestEgressPromisesOnAVM(t *testing.T) {
	t.Parallel()
	kernel, _ := needVM(t)
	needCurl(t)
	needUnshare(t)
	img := vmImageWithCurl(t)
	e := newEgressPromises(t)
	list := make([][]string, 0, len(e.probes))
	for _, p := range e.probes {
		list = append(list, append([]string{p.label, "/usr/bin/curl"}, p.argv[1:]...))
	}
	probes, err := json.Marshal(list)
	require.NoError(t, err)
	env, _ := json.Marshal([]string{"VMDAEMON_PROBES=" + string(probes)})
	s := startShim(t, sandboxSpec{
		provider: "qemu", name: uniqueName("vmegress"),
		bootstrap: `{"version":1,"stop_grace":"3s","daemon":{"argv":["` + vmDaemon + `"],"env":` + string(env) + `}}`,
		args: append([]string{"--kernel", kernel, "--initramfs", img, "--boot-timeout", vmBootTimeout.String(),
			"--host-grace", vmHostGrace.String()}, e.args...),
		files: e.files,
	})
	e.check(s, vmBootTimeout+60*time.Second)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 20*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
