package bench

// Real clients in real guests: curl (and, in a VM without curl, Go's HTTP
// client) inside a sandbox started by oac-shim, through the guest's HTTP
// proxy (a CONNECT tunnel, as HTTPS goes) and through transparent capture,
// beside the same client on the host against the same server. The clients
// run in the guest as its daemon (bench/internal/netprobe), which the
// bench reaches through a forward; the host's baseline runs the same code
// in this process. Runs alternate between host and guest.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/bench/internal/probe"
	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/internal/proctree"
	"github.com/oac/sandbox-agent/internal/unprivuser"
)

// guestProbePort is where the probe listens inside the guest.
const guestProbePort = 9090

// clientServers are the host's servers every client talks to: an HTTP
// server (GET /dl/N answers N bytes, PUT /ul counts what it reads) and an
// echo server.
type clientServers struct {
	web, echo string
}

// startClientServers starts both servers on host (an address of this
// machine: the loopback, or the test cluster's node address, which its
// Pods reach too).
func startClientServers(host string) (clientServers, func(), error) {
	wl, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return clientServers{}, nil, err
	}
	chunk := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			n, _ := io.CopyBuffer(io.Discard, onlyReader{r.Body}, make([]byte, 256<<10))
			fmt.Fprint(w, n)
			return
		}
		n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/dl/"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "want /dl/N", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			m, err := w.Write(chunk[:min(int64(len(chunk)), n)])
			if err != nil {
				return
			}
			n -= int64(m)
		}
	})}
	go func() { _ = srv.Serve(wl) }()
	el, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		srv.Close()
		return clientServers{}, nil, err
	}
	go func() {
		for {
			c, err := el.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); echo(c) }()
		}
	}()
	return clientServers{web: wl.Addr().String(), echo: el.Addr().String()}, func() { srv.Close(); el.Close() }, nil
}

// clientSetup makes a directory others can read (a guest's root is not
// the host's), builds the guest's probe there and starts the host's
// servers; stop undoes all of it.
func clientSetup(prefix string) (dir, probeBin string, srv clientServers, stop func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", srv, nil, err
	}
	fail := func(err error) (string, string, clientServers, func(), error) {
		os.RemoveAll(dir)
		return "", "", clientServers{}, nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	probeBin, err = buildProbe(dir)
	if err != nil {
		return fail(err)
	}
	srv, stopServers, err := startClientServers("127.0.0.1")
	if err != nil {
		return fail(err)
	}
	return dir, probeBin, srv, func() { stopServers(); os.RemoveAll(dir) }, nil
}

// buildProbe builds the guest's probe (static, amd64) into dir.
func buildProbe(dir string) (string, error) {
	bin := filepath.Join(dir, "netprobe")
	return bin, crossBuild("./bench/internal/netprobe", bin, "amd64")
}

// guestTarget is one sandbox the clients run in.
type guestTarget struct {
	label string
	args  []string
	// curl: the guest has curl (a default root shows the host's /usr);
	// a VM image has none, Go's client stands in.
	curl bool
	// sameKernel: the data plane's goals apply (a provider whose guest
	// shares this kernel, with the data plane on).
	sameKernel bool
	// user, when set, runs the shim as this unprivileged user (made with a
	// subordinate id range if missing), as a desktop app runs it.
	user string
	// shim, when set, is the shim binary (oac-shim-kubernetes) instead of
	// oac-shim.
	shim string
	// probeInImage: the guest image holds the probe at guestProbePath (a
	// provider whose nodes cannot see this host's files refuses
	// --install).
	probeInImage bool
}

// guestProbePath is where a guest finds the probe.
const guestProbePath = "/usr/local/bin/oac-netprobe"

// RootlessUser is the user the rootless rows run oac-shim as.
const RootlessUser = "oac-bench-subids"

// ClientFigures measures real clients in bwrap and OCI guests (with the
// data plane and, for bwrap, without it) and in a qemu guest, each beside
// the same client on the host.
func ClientFigures(r *Report, b Bins, runs int, size int64, kernelCache string) error {
	dir, probeBin, srv, stop, err := clientSetup("oac-bench-clients-")
	if err != nil {
		return err
	}
	defer stop()
	// Each target names its path (the data plane's default is to become
	// direct mode where its guarantees hold): these rows mean the handed
	// path, the session's streams, and qemu's yamux over virtio-serial.
	targets := []guestTarget{
		{label: "bwrap", args: []string{"--provider", "bwrap", "--data-plane", "fd"}, curl: true, sameKernel: true},
		{label: "bwrap, session only (--data-plane off)", args: []string{"--provider", "bwrap", "--data-plane", "off"}, curl: true},
	}
	if _, err := exec.LookPath("runc"); err == nil {
		targets = append(targets, guestTarget{label: "oci (runc)", args: []string{"--provider", "oci", "--runtime", "runc", "--data-plane", "fd"}, curl: true, sameKernel: true})
	} else {
		r.Skip("real clients in an OCI guest", "needs runc (make deps)")
	}
	for _, tg := range targets {
		if !clientTargetWanted(tg.label) {
			continue
		}
		if err := clientTargetFigures(r, b, tg, srv, probeBin, runs, size); err != nil {
			if errors.Is(err, errNoReady) && strings.Contains(err.Error(), "oac-netprobe") {
				// A provider that installs no binaries cannot run the probe.
				r.Skip("real clients in "+tg.label, "the provider does not install the probe (--install)")
				continue
			}
			return fmt.Errorf("clients in %s: %w", tg.label, err)
		}
	}
	if !clientTargetWanted("qemu (TCG, yamux over virtio-serial)") {
		return nil
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		r.Skip("real clients in a qemu guest", "needs qemu-system-x86")
		return nil
	}
	if _, err := os.Stat(filepath.Join(kernelCache, "modules", "modules.dep")); err != nil {
		r.Skip("real clients in a qemu guest", "needs the kernel cache "+kernelCache+" (make kernels)")
		return nil
	}
	img := filepath.Join(dir, "image")
	if _, err := imagebuild.Build(imagebuild.Spec{
		Injection: imagebuild.Injection{Agent: b.Guest, SandboxIO: b.Guest}, Arch: "amd64",
		Outputs: []string{imagebuild.OutVM}, Out: img,
		Kernel: filepath.Join(kernelCache, "vmlinuz"), ModulesDir: filepath.Join(kernelCache, "modules"),
	}); err != nil {
		return fmt.Errorf("qemu image: %w", err)
	}
	vm := guestTarget{label: "qemu (TCG, yamux over virtio-serial)", args: []string{"--provider", "qemu",
		"--kernel", filepath.Join(img, imagebuild.KernelName), "--initramfs", filepath.Join(img, imagebuild.InitramfsName),
		"--accel", "tcg", "--boot-timeout", "120s", "--data-plane", "off"}}
	// Software emulation moves bytes at a fraction of native speed: fewer
	// and smaller runs, and the figures say so.
	if err := clientTargetFigures(r, b, vm, srv, probeBin, min(runs, 5), min(size, 64<<20)); err != nil {
		return err
	}
	// The same VM over vsock: dialed data connections, the carrier of a
	// macOS VM (vz). Only where the host has vhost-vsock.
	const vsockLabel = "qemu (TCG, vsock: dialed data connections)"
	if !clientTargetWanted(vsockLabel) {
		return nil
	}
	if _, err := os.Stat("/dev/vhost-vsock"); err != nil {
		r.Skip("real clients in "+vsockLabel, "this machine has no /dev/vhost-vsock (a host that has the vhost_vsock module runs the row)")
		return nil
	}
	vsock := guestTarget{label: vsockLabel, args: append(append([]string(nil), vm.args[:len(vm.args)-2]...), "--vm-transport", "vsock")}
	return clientTargetFigures(r, b, vsock, srv, probeBin, min(runs, 5), min(size, 64<<20))
}

// clientTargetWanted reports whether the guest target labelled label
// runs: OAC_BENCH_CLIENTS, when set, lists the labels' prefixes to run
// (comma-separated labels, or prefixes ending in '*': "bwrap,oci*" leaves
// out qemu and bwrap's session-only rows), for a quick look at one
// provider's rows (with -only clients, which writes nothing). A list with
// a ';' is split at ';' only, so that labels with commas can be named:
// "bwrap, session*;" runs the session-only rows alone.
func clientTargetWanted(label string) bool {
	only := os.Getenv("OAC_BENCH_CLIENTS")
	if only == "" {
		return true
	}
	sep := ","
	if strings.Contains(only, ";") {
		sep = ";"
	}
	for _, p := range strings.Split(only, sep) {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if pre, ok := strings.CutSuffix(p, "*"); (ok && strings.HasPrefix(label, pre)) || (!ok && label == p) {
			return true
		}
	}
	return false
}

// guestRun is a guest's probe and its shim's process (with setpriv, the
// shim itself: setpriv execs it).
type guestRun struct {
	*probe.Client
	shimPID int
}

// guestProbe starts a sandbox of tg whose daemon is the probe, reachable
// through a forward, with up.test:80 and echo.test:7 as named upstreams.
func guestProbe(b Bins, tg guestTarget, srv clientServers, probeBin string) (*guestRun, func(), error) {
	fl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	fwd := fl.Addr().String()
	fl.Close()
	boot, _ := json.Marshal(map[string]any{"version": 1, "stop_grace": "1s",
		"daemon": map[string]any{"argv": []string{guestProbePath, "serve", fmt.Sprintf("127.0.0.1:%d", guestProbePort)}}})
	bootFile, err := os.CreateTemp("", "oac-bench-boot-")
	if err != nil {
		return nil, nil, err
	}
	_, _ = bootFile.Write(boot)
	bootFile.Close()
	if tg.user != "" {
		u, err := rootlessOwner(tg.user)
		if err == nil {
			err = os.Chown(bootFile.Name(), u, -1)
		}
		if err != nil {
			os.Remove(bootFile.Name())
			return nil, nil, err
		}
	}
	args := []string{"run", "--name", benchName(), "--agent", b.Guest, "--bootstrap", bootFile.Name(),
		"--upstream", "up.test:80=" + srv.web, "--upstream", "echo.test:7=" + srv.echo,
		"--forward", fmt.Sprintf("%s=%d", fwd, guestProbePort)}
	if !tg.probeInImage {
		args = append(args, "--install", filepath.Base(guestProbePath)+"="+probeBin)
	}
	args = append(args, tg.args...)
	shim := b.Shim
	if tg.shim != "" {
		shim = tg.shim
	}
	argv := append([]string{shim}, args...)
	if tg.user != "" {
		argv = unprivuser.Argv(tg.user, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		os.Remove(bootFile.Name())
		return nil, nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		os.Remove(bootFile.Name())
		return nil, nil, err
	}
	stopShim := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		os.Remove(bootFile.Name())
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if !sent && bytes.Contains(sc.Bytes(), []byte(`"state":"ready"`)) {
				ready <- true
				sent = true
			}
		}
		if !sent {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			stopShim()
			return nil, nil, fmt.Errorf("%w: %s", errNoReady, strings.TrimSpace(stderr.String()))
		}
	case <-time.After(3 * time.Minute):
		stopShim()
		return nil, nil, fmt.Errorf("%w within 3 minutes", errNoReady)
	}
	// The probe listens soon after the daemon started.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cl, err := probe.Dial(fwd)
		if err == nil {
			if _, err = cl.Run(probe.Request{Cmd: "ping"}); err == nil {
				return &guestRun{Client: cl, shimPID: cmd.Process.Pid}, func() { cl.Close(); stopShim() }, nil
			}
			cl.Close()
		}
		if time.Now().After(deadline) {
			stopShim()
			return nil, nil, fmt.Errorf("the guest's probe did not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clientPath is how a guest's client reaches the server.
type clientPath struct {
	name  string
	proxy string   // the guest's HTTP proxy, for a CONNECT tunnel
	curl  []string // curl's flags for the path
}

var clientPaths = []clientPath{
	{name: "proxy", proxy: "127.0.0.1:3128", curl: []string{"-p", "-x", "http://127.0.0.1:3128"}},
	{name: "transparent", curl: []string{"--noproxy", "*"}},
}

// clientRow is one figure: the same request on the host and in the guest.
type clientRow struct {
	what, unit string
	host, gst  probe.Request
	// scale turns the measured value into the figure.
	scale func(float64) float64
	goal  string
	holds func(ratio float64) bool
}

func clientTargetFigures(r *Report, b Bins, tg guestTarget, srv clientServers, probeBin string, runs int, size int64) error {
	guest, stop, err := guestProbe(b, tg, srv, probeBin)
	if err != nil {
		return err
	}
	defer stop()
	inGuest := func(req probe.Request) func() (float64, error) {
		return func() (float64, error) { return guest.Run(req) }
	}
	client := "curl"
	if !tg.curl {
		client = "Go's HTTP client (no curl in the VM image)"
	}
	for _, p := range clientPaths {
		label := fmt.Sprintf("%s, %s, %s", tg.label, p.name, client)
		var rows []clientRow
		dl := func(base string, flags []string) probe.Request {
			if !tg.curl {
				return probe.Request{Cmd: "get", URL: base + "/dl/" + strconv.FormatInt(size, 10), Size: size}
			}
			return probe.Request{Cmd: "curl", Args: append(append([]string{"-sS", "-o", "/dev/null", "-w", "%{speed_download}"}, flags...), base+"/dl/"+strconv.FormatInt(size, 10))}
		}
		ul := func(base string, flags []string) probe.Request {
			if !tg.curl {
				return probe.Request{Cmd: "put", URL: base + "/ul", Size: size}
			}
			return probe.Request{Cmd: "curl", Stdin: size, Args: append(append([]string{"-sS", "-o", "/dev/null", "-w", "%{speed_upload}", "-T", "-"}, flags...), base+"/ul")}
		}
		flows := func(base string, flags []string) probe.Request {
			if !tg.curl {
				return probe.Request{Cmd: "gets", URL: base + "/dl/" + strconv.FormatInt(size/8, 10), Size: size, Flows: 8}
			}
			return probe.Request{Cmd: "curls", Flows: 8, Args: append(append([]string{"-sS", "-o", "/dev/null"}, flags...), base+"/dl/"+strconv.FormatInt(size/8, 10))}
		}
		hostBase, guestBase := "http://"+srv.web, "http://up.test"
		withProxy := func(req probe.Request) probe.Request {
			if !tg.curl && p.proxy != "" {
				req.Proxy = p.proxy
			}
			return req
		}
		mbps := func(v float64) float64 { return v / 1e6 }
		if !tg.curl {
			mbps = func(v float64) float64 { return v }
		}
		sameKernel := tg.sameKernel
		add := func(what, unit string, h, g probe.Request, scale func(float64) float64, goal string, holds func(float64) bool) {
			rows = append(rows, clientRow{what, unit, h, g, scale, goal, holds})
		}
		oneFlowGoal, oneFlow := "≥ 0.5x host (yamux path)", func(x float64) bool { return x >= 0.5 }
		if sameKernel {
			oneFlowGoal, oneFlow = "≥ 0.8x host", func(x float64) bool { return x >= 0.8 }
		}
		add(fmt.Sprintf("download %d MiB", size>>20), "MB/s", dl(hostBase, nil), withProxy(dl(guestBase, p.curl)), mbps, oneFlowGoal, oneFlow)
		add(fmt.Sprintf("upload %d MiB", size>>20), "MB/s", ul(hostBase, nil), withProxy(ul(guestBase, p.curl)), mbps, oneFlowGoal, oneFlow)
		flowScale := func(v float64) float64 { return float64(size) / v / 1e6 } // seconds -> MB/s
		if !tg.curl {
			flowScale = func(v float64) float64 { return v }
		}
		var eightGoal string
		var eight func(float64) bool
		if sameKernel {
			eightGoal, eight = "≥ 0.7x host", func(x float64) bool { return x >= 0.7 }
		}
		add(fmt.Sprintf("8 flows at once, %d MiB in all", size>>20), "MB/s", flows(hostBase, nil), withProxy(flows(guestBase, p.curl)), flowScale, eightGoal, eight)
		var lowGoal string
		var low func(float64) bool
		if sameKernel {
			lowGoal, low = "≤ 1.5x host", func(x float64) bool { return x <= 1.5 }
		}
		ident := func(v float64) float64 { return v }
		add("connect + first byte (median of 100)", "µs",
			probe.Request{Cmd: "connect", Target: srv.web, N: 100},
			probe.Request{Cmd: "connect", Target: "up.test:80", Proxy: p.proxy, N: 100}, ident, lowGoal, low)
		add("64-byte round trip p50 (2000 on one connection)", "µs",
			probe.Request{Cmd: "rtt", Target: srv.echo, N: 2000},
			probe.Request{Cmd: "rtt", Target: "echo.test:7", Proxy: p.proxy, N: 2000}, ident, lowGoal, low)
		for _, row := range rows {
			scaled := func(f func() (float64, error)) func() (float64, error) {
				return func() (float64, error) {
					v, err := f()
					return row.scale(v), err
				}
			}
			base, subj, err := Pair(runs, scaled(hostRun(row.host)), scaled(inGuest(row.gst)))
			if err != nil {
				return fmt.Errorf("%s, %s: %w", label, row.what, err)
			}
			res := NewResult(label+": "+row.what, row.unit, subj, "the same client on the host", base)
			if !tg.sameKernel && strings.HasPrefix(tg.label, "qemu") {
				res.Note = "software emulation: the guest's CPU is emulated"
			}
			if row.holds != nil {
				res = res.Judge(row.goal, row.holds(res.Ratio))
			}
			r.Add(res)
		}
	}
	return nil
}

// rootlessOwner makes sure name exists with a subordinate id range and
// returns its uid.
func rootlessOwner(name string) (int, error) {
	if err := unprivuser.Ensure(name, true); err != nil {
		return 0, fmt.Errorf("the rootless rows' user: %w", err)
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Uid)
}

// treeCPU is the CPU seconds (user and system) that process pid and its
// descendants have used, the reaped ones included (proctree.Proc.CPUTicks).
func treeCPU(pid int) (float64, error) {
	by, err := treeCPUBy(pid)
	var total float64
	for _, v := range by {
		total += v
	}
	return total, err
}

// treeCPUBy is treeCPU by process name: a process that ended is counted
// in its parent's (the client in the probe daemon that reaped it).
func treeCPUBy(pid int) (map[string]float64, error) {
	all := proctree.All()
	by := map[string]float64{}
	found := false
	for _, p := range all {
		if p.PID == pid {
			by[p.Comm] += float64(p.CPUTicks) / proctree.ClockTicks
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("process %d is gone", pid)
	}
	for _, p := range proctree.Descendants(all, pid) {
		by[p.Comm] += float64(p.CPUTicks) / proctree.ClockTicks
	}
	return by, nil
}

// selfCPU is the CPU seconds this process has used (the bench's servers
// run in it).
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// hostRun runs req with the same client in this process (the host's
// baseline).
func hostRun(req probe.Request) func() (float64, error) {
	return func() (float64, error) {
		res := probe.Run(req)
		if res.Err != "" {
			return 0, fmt.Errorf("host: %s", res.Err)
		}
		return res.Value, nil
	}
}
