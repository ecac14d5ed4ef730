package bench

// The nearest peer: Anthropic's sandbox-runtime (srt, installed from the
// npm registry), which runs a command in bubblewrap with no network and
// routes it through HTTP and SOCKS proxies on the host. The same curl
// fetches from the same server on the host (by address, and by a name
// resolved through DNS as a guest's is), through srt, and in oac's bwrap
// guests, each path through the capture and through HTTP_PROXY: the
// handed path (a root shim's fd channel), direct mode, a rootless shim
// (run as an unprivileged user, as the desktop app runs it: its hand-only
// fd channel, and with --data-plane dial the dialed data connections a
// vsock VM takes) and the session stream (--data-plane off, the path
// of WSL and virtio-serial VMs), all interleaved in every round, so load
// hits each alike; and what each download costs in CPU seconds per GiB.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/oac/sandbox-agent/bench/internal/probe"
	"github.com/oac/sandbox-agent/protocol"
)

// SRTVersion is the sandbox-runtime release the bench installs.
const SRTVersion = "0.0.83"

// PeerGroup is the peer's group of figures (-only peer).
const PeerGroup = "peer"

// srtCLI installs srt under cache (once) and returns its CLI script, or
// why it cannot run here.
func srtCLI(cache string) (string, string) {
	for _, bin := range []string{"node", "npm", "bwrap", "socat", "rg", "curl"} {
		if _, err := exec.LookPath(bin); err != nil {
			return "", "needs " + bin + " (srt runs on Node.js and needs bubblewrap, socat and ripgrep: apt-get install nodejs npm bubblewrap socat ripgrep curl)"
		}
	}
	cache, err := filepath.Abs(cache)
	if err != nil {
		return "", err.Error()
	}
	dir := filepath.Join(cache, "srt-"+SRTVersion)
	cli := filepath.Join(dir, "node_modules", "@anthropic-ai", "sandbox-runtime", "dist", "cli.js")
	if _, err := os.Stat(cli); err == nil {
		return cli, ""
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	out, err := exec.Command("npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--silent",
		"@anthropic-ai/sandbox-runtime@"+SRTVersion).CombinedOutput()
	if err != nil {
		return "", fmt.Sprintf("npm install @anthropic-ai/sandbox-runtime@%s: %v: %s", SRTVersion, err, strings.TrimSpace(string(out)))
	}
	return cli, ""
}

// srtRunner runs one curl through srt and returns what its -w printed.
type srtRunner struct {
	cli, settings, dir string
}

func newSRTRunner(cli, web string) (*srtRunner, func(), error) {
	dir, err := os.MkdirTemp("", "oac-bench-srt-")
	if err != nil {
		return nil, nil, err
	}
	// The server is on the host's loopback: srt's address check allows it
	// only as an explicit address entry.
	settings, _ := json.Marshal(map[string]any{
		"network":    map[string]any{"allowedDomains": []string{web}, "deniedDomains": []string{}},
		"filesystem": map[string]any{"denyRead": []string{}, "allowWrite": []string{dir}, "denyWrite": []string{}},
	})
	f := filepath.Join(dir, "srt-settings.json")
	if err := os.WriteFile(f, settings, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return &srtRunner{cli: cli, settings: f, dir: dir}, func() { os.RemoveAll(dir) }, nil
}

func (s *srtRunner) curl(args ...string) func() (float64, error) {
	return func() (float64, error) {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		// --noproxy '': srt's NO_PROXY lists the loopback, which inside
		// its sandbox is its own; the proxy is the only way out.
		cmd := exec.Command("node", s.cli, "-s", s.settings, "-c", "curl --noproxy '' "+strings.Join(quoted, " "))
		cmd.Dir = s.dir
		return curlValue("srt", cmd)
	}
}

// curlValue runs cmd and returns the number curl's -w printed last.
func curlValue(who string, cmd *exec.Cmd) (float64, error) {
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("%s: %v: %s", who, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return 0, fmt.Errorf("%s: %w", who, err)
	}
	lines := strings.Fields(string(out))
	if len(lines) == 0 {
		return 0, fmt.Errorf("%s: curl printed nothing", who)
	}
	return strconv.ParseFloat(lines[len(lines)-1], 64)
}

// peerName is the upstream's name in the guests; the host resolves it too.
const peerName = "up.test"

// hostByName returns a curl on the host that resolves peerName through
// DNS, as a guest's curl does: a resolver in this process on a loopback
// port 53 (the only port glibc asks) answers its A question with the
// server's address from memory (as the guest's resolver answers a name it
// has cached), its others with no answer (the server has no IPv6 address;
// the guest's resolver gives one of its own), other names NXDOMAIN. The curl
// runs in a mount namespace of its own whose /etc/resolv.conf (the
// guest's, naming that resolver) is bound over the machine's, which stays
// as it is.
func hostByName(dir, web string) (func(args ...string) func() (float64, error), func(), error) {
	if _, err := exec.LookPath("unshare"); err != nil {
		return nil, nil, errors.New("needs unshare (util-linux)")
	}
	ap, err := netip.ParseAddrPort(web)
	if err != nil || !ap.Addr().Is4() {
		return nil, nil, fmt.Errorf("the server %s is not an IPv4 address", web)
	}
	var pc net.PacketConn
	for i := 1; i <= 16 && pc == nil; i++ {
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("127.83.0.%d:53", i))
	}
	if pc == nil {
		return nil, nil, err
	}
	ns, _, _ := strings.Cut(pc.LocalAddr().String(), ":")
	conf := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(conf, []byte(strings.Replace(protocol.ResolvConf, "127.0.0.1", ns, 1)), 0o644); err != nil {
		pc.Close()
		return nil, nil, err
	}
	go answerDNS(pc, dnsmessage.MustNewName(peerName+"."), ap.Addr().As4())
	run := func(args ...string) func() (float64, error) {
		return func() (float64, error) {
			return curlValue("host, by name", exec.Command("unshare", append([]string{"--mount", "sh", "-c",
				`mount --bind "$0" /etc/resolv.conf && exec curl "$@"`, conf}, args...)...))
		}
	}
	return run, func() { pc.Close() }, nil
}

func answerDNS(pc net.PacketConn, name dnsmessage.Name, a [4]byte) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
		if !strings.EqualFold(q.Name.String(), name.String()) {
			rh.RCode = dnsmessage.RCodeNameError
		}
		b := dnsmessage.NewBuilder(nil, rh)
		_ = b.StartQuestions()
		_ = b.Question(q)
		if rh.RCode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
			_ = b.StartAnswers()
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}, dnsmessage.AResource{A: a})
		}
		if m, err := b.Finish(); err == nil {
			_, _ = pc.WriteTo(m, from)
		}
	}
}

// peerGoal is a goal on a ratio.
type peerGoal struct {
	text  string
	holds func(ratio float64) bool
}

func atLeast(x float64, of string) peerGoal {
	return peerGoal{fmt.Sprintf("≥ %gx %s", x, of), func(r float64) bool { return r >= x }}
}

func atMost(x float64, of string) peerGoal {
	return peerGoal{fmt.Sprintf("≤ %gx %s", x, of), func(r float64) bool { return r <= x }}
}

// PeerFigures measures curl's download and connect + first byte on the
// host (by address and by name), through srt and in oac's bwrap guests in
// interleaved rounds, and reports each beside the host and oac's beside
// srt's; direct mode's also beside the host by name and the handed path.
func PeerFigures(r *Report, b Bins, runs int, size int64, cache string) error {
	cli, why := srtCLI(cache)
	if why != "" {
		r.Skip(PeerGroup+": sandbox-runtime "+SRTVersion, why)
		return nil
	}
	dir, probeBin, srv, stop, err := clientSetup("oac-bench-peer-")
	if err != nil {
		return err
	}
	defer stop()
	byName, stopResolver, err := hostByName(dir, srv.web)
	if err != nil {
		return fmt.Errorf("peer: the host's curl by name: %w", err)
	}
	defer stopResolver()
	srt, cleanup, err := newSRTRunner(cli, srv.web)
	if err != nil {
		return err
	}
	defer cleanup()
	// Every guest names its path: direct mode is the default where its
	// guarantees hold, and the rows must keep their meaning.
	guests := []struct {
		what string
		tg   guestTarget
		g    *guestRun
	}{
		{what: "on the handed path", tg: guestTarget{label: "bwrap", args: []string{"--provider", "bwrap", "--data-plane", "fd"}, curl: true, sameKernel: true}},
		{what: "in direct mode", tg: guestTarget{label: "bwrap-direct", args: []string{"--provider", "bwrap", "--data-plane", "direct"}, curl: true, sameKernel: true}},
		{what: "rootless (handed on its hand-only fd channel)", tg: guestTarget{label: "bwrap-rootless", args: []string{"--provider", "bwrap"}, curl: true, user: RootlessUser}},
		{what: "rootless (dialed data connections)", tg: guestTarget{label: "bwrap-rootless-dial", args: []string{"--provider", "bwrap", "--data-plane", "dial"}, curl: true, user: RootlessUser}},
		{what: "on the session stream", tg: guestTarget{label: "bwrap-session", args: []string{"--provider", "bwrap", "--data-plane", "off"}, curl: true}},
	}
	for i := range guests {
		g, stopGuest, err := guestProbe(b, guests[i].tg, srv, probeBin)
		if err != nil {
			return fmt.Errorf("peer: the oac guest %s: %w", guests[i].what, err)
		}
		defer stopGuest()
		guests[i].g = g
	}
	handed, direct, rootless, dialed, session := guests[0].g, guests[1].g, guests[2].g, guests[3].g, guests[4].g
	// cpu, when not nil, gets the CPU seconds each run used: curl's on
	// the host; in a guest, all its sandbox's processes' (the shim, bwrap,
	// the agent, curl), read from /proc around the run.
	// cpuUse is what one path's downloads cost: the client's (or the
	// sandbox's processes', by name) and the server's (this process).
	type cpuUse struct {
		total, server []float64
		by            map[string][]float64
	}
	host := func(cpu *cpuUse, args ...string) func() (float64, error) {
		return func() (float64, error) {
			s0 := selfCPU()
			res := probe.Run(probe.Request{Cmd: "curl", Args: args})
			if res.Err != "" {
				return 0, fmt.Errorf("host: %s", res.Err)
			}
			if cpu != nil {
				// The probe runs curl as a child of this process: its
				// own CPU is reported apart, not in selfCPU.
				cpu.total = append(cpu.total, res.CPU)
				cpu.server = append(cpu.server, selfCPU()-s0)
			}
			return res.Value, nil
		}
	}
	inGuest := func(g *guestRun, cpu *cpuUse, args ...string) func() (float64, error) {
		return func() (float64, error) {
			before, err := treeCPUBy(g.shimPID)
			if err != nil {
				return 0, err
			}
			s0 := selfCPU()
			v, err := g.Run(probe.Request{Cmd: "curl", Args: args})
			if err == nil && cpu != nil {
				server := selfCPU() - s0
				after, err := treeCPUBy(g.shimPID)
				if err != nil {
					return 0, err
				}
				var total float64
				if cpu.by == nil {
					cpu.by = map[string][]float64{}
				}
				for name, a := range after {
					total += a - before[name]
					cpu.by[name] = append(cpu.by[name], a-before[name])
				}
				cpu.total = append(cpu.total, total)
				cpu.server = append(cpu.server, server)
			}
			return v, err
		}
	}
	// A path's goals (the issue's): download beside the host by address,
	// connect + first byte beside the host resolving the same name
	// (direct mode also beside the host by address and its download by
	// name); every path beside srt.
	type goals struct{ download, connectByName, connect, downloadByName peerGoal }
	type figure struct {
		what, unit, url, write string
		scale                  func(float64) float64
		connect                bool
		srt                    peerGoal
	}
	dl := "/dl/" + strconv.FormatInt(size, 10)
	figures := []figure{
		{fmt.Sprintf("curl download %d MiB", size>>20), "MB/s", dl, "%{speed_download}",
			func(v float64) float64 { return v / 1e6 }, false, atLeast(4, "srt")},
		{"curl connect + first byte (a fresh connection, 1-byte file)", "µs", "/dl/1", "%{time_starttransfer}",
			func(v float64) float64 { return v * 1e6 }, true, atMost(0.5, "srt")},
	}
	const (
		onHost   = "the same curl on the host (an address)"
		onHostBy = "the same curl on the host by name"
	)
	handedGoals := goals{download: atLeast(0.85, "the host"), connectByName: atMost(1.8, "the host by name")}
	// The dialed carrier's goals (rootless shims took it before they took
	// handed sockets; vsock VMs take it).
	dialedGoals := goals{download: atLeast(0.7, "the host"), connectByName: atMost(2, "the host by name")}
	sessionGoals := goals{download: atLeast(0.5, "the host"), connectByName: atMost(5, "the host by name")}
	paths := []struct {
		name, flags string
		g           *guestRun
		goals       goals
		direct      bool
	}{
		{"oac bwrap, transparent (handed, --data-plane fd)", "--noproxy *", handed, handedGoals, false},
		{"oac bwrap, plain HTTP through HTTP_PROXY (handed, --data-plane fd)", "-x http://127.0.0.1:3128", handed, handedGoals, false},
		{"oac bwrap, direct mode (--data-plane direct)", "--noproxy *", direct,
			goals{download: atLeast(0.9, "the host"), downloadByName: atLeast(0.9, "the host by name"), connect: atMost(1.5, "the host"), connectByName: atMost(1.3, "the host by name")}, true},
		{"oac bwrap rootless (shim as a user), transparent (handed, hand-only fd channel)", "--noproxy *", rootless, handedGoals, false},
		{"oac bwrap rootless (shim as a user), plain HTTP through HTTP_PROXY (handed, hand-only fd channel)", "-x http://127.0.0.1:3128", rootless, handedGoals, false},
		{"oac bwrap rootless (shim as a user), transparent (dialed data connections, --data-plane dial)", "--noproxy *", dialed, dialedGoals, false},
		{"oac bwrap rootless (shim as a user), plain HTTP through HTTP_PROXY (dialed data connections, --data-plane dial)", "-x http://127.0.0.1:3128", dialed, dialedGoals, false},
		{"oac bwrap, transparent (session stream, --data-plane off)", "--noproxy *", session, sessionGoals, false},
		{"oac bwrap, plain HTTP through HTTP_PROXY (session stream, --data-plane off)", "-x http://127.0.0.1:3128", session, sessionGoals, false},
	}
	_, port, _ := net.SplitHostPort(srv.web)
	for _, f := range figures {
		add := func(name string, v []float64, baseName string, base []float64, g peerGoal) {
			res := NewResult("peer: "+name+": "+f.what, f.unit, v, baseName, base)
			if g.text != "" {
				res = res.Judge(g.text, g.holds(res.Ratio))
			}
			r.Add(res)
		}
		base := []string{"-sS", "-o", "/dev/null", "-w", f.write}
		with := func(more ...string) []string { return append(append([]string(nil), base...), more...) }
		var hostV, nameV, srtV []float64
		var hostCPU cpuUse
		oacV, oacCPU := make([][]float64, len(paths)), make([]cpuUse, len(paths))
		cpuOf := func(c *cpuUse) *cpuUse {
			if f.connect {
				return nil
			}
			return c
		}
		for range runs {
			measure := []func() (float64, error){
				host(cpuOf(&hostCPU), with("http://"+srv.web+f.url)...),
				byName(with("http://" + peerName + ":" + port + f.url)...),
				srt.curl(with("http://" + srv.web + f.url)...),
			}
			for i, p := range paths {
				measure = append(measure, inGuest(p.g, cpuOf(&oacCPU[i]), with(append(strings.Fields(p.flags), "http://"+peerName+f.url)...)...))
			}
			vals := make([]float64, len(measure))
			for i, m := range measure {
				v, err := m()
				if err != nil {
					return fmt.Errorf("peer, %s: %w", f.what, err)
				}
				vals[i] = f.scale(v)
			}
			hostV, nameV, srtV = append(hostV, vals[0]), append(nameV, vals[1]), append(srtV, vals[2])
			for i := range paths {
				oacV[i] = append(oacV[i], vals[3+i])
			}
		}
		add("curl on the host by name ("+peerName+" through a DNS resolver on the host's loopback)", nameV, onHost, hostV, peerGoal{})
		add("sandbox-runtime "+SRTVersion+" (bwrap + host proxy)", srtV, onHost, hostV, peerGoal{})
		for i, p := range paths {
			byAddr, byNameGoal := p.goals.download, p.goals.downloadByName
			if f.connect {
				byAddr, byNameGoal = p.goals.connect, p.goals.connectByName
			}
			add(p.name, oacV[i], onHost, hostV, byAddr)
			add(p.name+" beside the host by name", oacV[i], onHostBy, nameV, byNameGoal)
			add(p.name+" beside srt", oacV[i], "the same curl through srt", srtV, f.srt)
			if p.direct {
				add(p.name+" beside the handed path", oacV[i], "the same curl in the guest on the handed path (transparent)", oacV[0], peerGoal{})
			}
		}
		if f.connect {
			continue
		}
		// CPU seconds per GiB moved: what each path costs the machine
		// beside what curl alone costs on the host, by process; and the
		// ceiling that cost sets on this machine's CPUs, with the
		// server's share (this process), beside what was measured.
		perGiB := func(v []float64) []float64 {
			out := make([]float64, len(v))
			for i, x := range v {
				out[i] = x / (float64(size) / (1 << 30))
			}
			return out
		}
		ceiling := func(c cpuUse) []float64 {
			out := make([]float64, len(c.total))
			for i := range c.total {
				if per := c.total[i] + c.server[i]; per > 0 {
					out[i] = float64(runtime.NumCPU()) * float64(size) / per / 1e6
				}
			}
			return out
		}
		r.Add(NewResult("peer: the server's CPU seconds per GiB (this process), curl on the host (an address)", "s/GiB", perGiB(hostCPU.server), "", nil))
		r.Add(NewResult(fmt.Sprintf("peer: curl on the host (an address): download ceiling on %d CPUs from CPU per GiB (curl and the server)", runtime.NumCPU()), "MB/s",
			ceiling(hostCPU), "the same download measured", hostV))
		for i, p := range paths {
			res := NewResult("peer: "+p.name+": CPU seconds per GiB downloaded (the sandbox's processes: shim, bwrap, agent, curl)", "s/GiB",
				perGiB(oacCPU[i].total), "curl on the host (an address)", perGiB(hostCPU.total))
			res.Note = cpuByProcess(oacCPU[i].by, size)
			r.Add(res)
			r.Add(NewResult(fmt.Sprintf("peer: %s: download ceiling on %d CPUs from CPU per GiB (the sandbox's and the server's)", p.name, runtime.NumCPU()), "MB/s",
				ceiling(oacCPU[i]), "the same download measured", oacV[i]))
		}
	}
	return nil
}

// cpuByProcess says where a path's CPU per GiB went, by process name
// (medians, the largest first; a client that ended is in the process
// that reaped it: curl in oac-netprobe).
func cpuByProcess(by map[string][]float64, size int64) string {
	type part struct {
		name string
		v    float64
	}
	var parts []part
	for name, v := range by {
		if m := Summarise(v).Median / (float64(size) / (1 << 30)); m >= 0.005 {
			parts = append(parts, part{name, m})
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].v > parts[j].v })
	var b strings.Builder
	b.WriteString("by process, s/GiB:")
	for _, p := range parts {
		fmt.Fprintf(&b, " %s %.2f", p.name, p.v)
	}
	return b.String()
}
