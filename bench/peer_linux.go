package bench

// The nearest peer: Anthropic's sandbox-runtime (srt, installed from the
// npm registry), which runs a command in bubblewrap with no network and
// routes it through HTTP and SOCKS proxies on the host. The same curl
// fetches from the same server on the host, through srt, and in oac's
// bwrap guest (transparent capture, and plain HTTP through HTTP_PROXY),
// the four interleaved in every round, so load hits each alike.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/bench/internal/probe"
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
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return 0, fmt.Errorf("srt: %v: %s", err, strings.TrimSpace(string(ee.Stderr)))
			}
			return 0, fmt.Errorf("srt: %w", err)
		}
		lines := strings.Fields(string(out))
		if len(lines) == 0 {
			return 0, errors.New("srt: curl printed nothing")
		}
		return strconv.ParseFloat(lines[len(lines)-1], 64)
	}
}

// PeerFigures measures curl's download and connect + first byte on the
// host, through srt and in oac's bwrap guest in interleaved rounds, and
// reports each beside the host and oac's beside srt's.
func PeerFigures(r *Report, b Bins, runs int, size int64, cache string) error {
	cli, why := srtCLI(cache)
	if why != "" {
		r.Skip(PeerGroup+": sandbox-runtime "+SRTVersion, why)
		return nil
	}
	_, probeBin, srv, stop, err := clientSetup("oac-bench-peer-")
	if err != nil {
		return err
	}
	defer stop()
	srt, cleanup, err := newSRTRunner(cli, srv.web)
	if err != nil {
		return err
	}
	defer cleanup()
	guest, stopGuest, err := guestProbe(b, guestTarget{label: "bwrap", args: []string{"--provider", "bwrap"}, curl: true, sameKernel: true}, srv, probeBin)
	if err != nil {
		return fmt.Errorf("peer: the oac guest: %w", err)
	}
	defer stopGuest()
	direct, stopDirect, err := guestProbe(b, guestTarget{label: "bwrap-direct", args: []string{"--provider", "bwrap", "--data-plane", "direct"}, curl: true, sameKernel: true}, srv, probeBin)
	if err != nil {
		return fmt.Errorf("peer: the oac guest in direct mode: %w", err)
	}
	defer stopDirect()
	host := func(args ...string) func() (float64, error) {
		return func() (float64, error) {
			res := probe.Run(probe.Request{Cmd: "curl", Args: args})
			if res.Err != "" {
				return 0, fmt.Errorf("host: %s", res.Err)
			}
			return res.Value, nil
		}
	}
	inGuest := func(g *probe.Client, args ...string) func() (float64, error) {
		return func() (float64, error) { return g.Run(probe.Request{Cmd: "curl", Args: args}) }
	}
	type figure struct {
		what, unit, url, write string
		scale                  func(float64) float64
		better                 func(oacOverSRT float64) bool
		goal                   string
		// beside the host: issue-level goals per path kind.
		handed, directGoal string
		hostBetter         func(ratio float64, direct bool) bool
	}
	dl := "/dl/" + strconv.FormatInt(size, 10)
	figures := []figure{
		{fmt.Sprintf("curl download %d MiB", size>>20), "MB/s", dl, "%{speed_download}",
			func(v float64) float64 { return v / 1e6 }, func(x float64) bool { return x >= 4 }, "≥ 4x srt",
			"≥ 0.7x the host", "≥ 0.9x the host", func(x float64, direct bool) bool { return x >= map[bool]float64{false: 0.7, true: 0.9}[direct] }},
		{"curl connect + first byte (a fresh connection, 1-byte file)", "µs", "/dl/1", "%{time_starttransfer}",
			func(v float64) float64 { return v * 1e6 }, func(x float64) bool { return x <= 0.5 }, "≤ 0.5x srt",
			"≤ 2.5x the host", "≤ 1.5x the host", func(x float64, direct bool) bool { return x <= map[bool]float64{false: 2.5, true: 1.5}[direct] }},
	}
	paths := []struct {
		name, flags string
		g           *probe.Client
		direct      bool
	}{
		{"oac bwrap, transparent", "--noproxy *", guest, false},
		{"oac bwrap, plain HTTP through HTTP_PROXY", "-x http://127.0.0.1:3128", guest, false},
		{"oac bwrap, direct mode", "--noproxy *", direct, true},
	}
	for _, f := range figures {
		base := []string{"-sS", "-o", "/dev/null", "-w", f.write}
		var hostV, srtV []float64
		oacV := make([][]float64, len(paths))
		for range runs {
			measure := []func() (float64, error){host(append(base, "http://"+srv.web+f.url)...), srt.curl(append(base, "http://"+srv.web+f.url)...)}
			for _, p := range paths {
				measure = append(measure, inGuest(p.g, append(append(append([]string(nil), base...), strings.Fields(p.flags)...), "http://up.test"+f.url)...))
			}
			vals := make([]float64, len(measure))
			for i, m := range measure {
				v, err := m()
				if err != nil {
					return fmt.Errorf("peer, %s: %w", f.what, err)
				}
				vals[i] = f.scale(v)
			}
			hostV, srtV = append(hostV, vals[0]), append(srtV, vals[1])
			for i := range paths {
				oacV[i] = append(oacV[i], vals[2+i])
			}
		}
		r.Add(NewResult("peer: sandbox-runtime "+SRTVersion+" (bwrap + host proxy): "+f.what, f.unit, srtV, "the same curl on the host", hostV))
		for i, p := range paths {
			goal := f.handed
			if p.direct {
				goal = f.directGoal
			}
			hr := NewResult("peer: "+p.name+": "+f.what, f.unit, oacV[i], "the same curl on the host", hostV)
			r.Add(hr.Judge(goal, f.hostBetter(hr.Ratio, p.direct)))
			res := NewResult("peer: "+p.name+" beside srt: "+f.what, f.unit, oacV[i], "the same curl through srt", srtV)
			r.Add(res.Judge(f.goal, f.better(res.Ratio)))
		}
	}
	return nil
}
