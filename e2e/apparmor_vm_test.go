//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/internal/dockerd"
	"github.com/oac/sandbox-agent/internal/hostvm"
)

// The row "docker on an AppArmor host" of TestConformance: the docker row,
// run where Ubuntu and Debian run Docker, on a kernel that enforces
// AppArmor and an engine that confines containers with it. This machine's
// kernel has no AppArmor, so the row runs in a qemu VM (internal/hostvm)
// booting Debian's cloud kernel (AppArmor on by default) with this
// machine's own userspace: its dockerd loads docker-default because
// apparmor_parser is installed.
//
// On the host, the VM runs this very test binary, with the host's
// binaries (OAC_E2E_BINS) and -test.run naming the row; a run of the
// whole suite starts it with the run (TestMain), as it takes minutes
// under emulation. runConfRow hands the row to runRowInAppArmorVM, which
// waits for the VM and turns what the run there wrote (results.json in
// the work share) into the row's cells and subtests. In
// the VM, rowDockerAppArmor is the row's setup: the kernel and engine must
// enforce AppArmor, the engine's default must refuse as promised before
// any profile of ours is loaded, and the sandbox's confinement, as the
// kernel reports it, is recorded for the host to check and log.

const (
	// appArmorRow is the row's name. On the host, runConfRow boots the VM
	// and runs the row there.
	appArmorRow = "docker on an AppArmor host"
	// appArmorVMEnv is set in the VM to the work directory the run there
	// writes its results to.
	appArmorVMEnv = "OAC_E2E_APPARMOR_VM"
	// appArmorVMTimeout bounds the VM; the run inside ends a minute
	// earlier, so that its own timeout says which test hung.
	appArmorVMTimeout = 12 * time.Minute
	// appArmorVMBoot bounds a sandbox's boot to ready under emulation.
	appArmorVMBoot = 2 * time.Minute
	// guestProfile is the AppArmor profile the docker provider confines
	// the guest with on such a host.
	guestProfile = apparmor.Name
	// requireRefusesCheck names the row's check of that failure.
	requireRefusesCheck = "--docker-apparmor require with no oac-guest profile loaded: apparmor_profile_missing, nothing created"
)

func inAppArmorVM() bool { return os.Getenv(appArmorVMEnv) != "" }

// vmRowResults is what the run in the VM writes for the host.
type vmRowResults struct {
	// Cells are the columns' outcomes, Crash the crash cells' (by
	// crashCell.String()), Note the ready message.
	Cells map[string]string `json:"cells"`
	Crash map[string]string `json:"crash"`
	Note  string            `json:"note"`
	// Checks are the row's subtests beside the columns; Refusal is the
	// failure --docker-apparmor require gave.
	Checks  map[string]string `json:"checks"`
	Refusal string            `json:"refusal"`
	// Kernel is the kernel, its LSMs and AppArmor's state; Engine the
	// engine's security options.
	Kernel string `json:"kernel"`
	Engine string `json:"engine"`
	// Profiles are the kernel's loaded profiles while the row's first
	// sandbox ran (/sys/kernel/security/apparmor/profiles).
	Profiles string `json:"profiles"`
	// Confinement is that sandbox's processes as the kernel confines them.
	Confinement []vmProc `json:"confinement"`
}

// vmProc is a process of the sandbox: its confinement is
// /proc/PID/attr/current.
type vmProc struct {
	PID   int    `json:"pid"`
	Comm  string `json:"comm"`
	Label string `json:"label"`
	// Contained: in the container's pid namespace (else the host's: the
	// docker client).
	Contained bool `json:"contained"`
}

// vmFacts is what the row in the VM gathers beside the table.
var vmFacts struct {
	mu sync.Mutex
	vmRowResults
}

// appArmorCrashEnv picks the crash cells the row runs in the VM: all,
// none, or (unset) appArmorCrashCells.
const appArmorCrashEnv = "OAC_E2E_APPARMOR_CRASH"

// appArmorCrashCells are the cells the row runs by default, those where
// the provider holds something made under the profile when the shim is
// killed: a kept container created, a guest running confined, a kept
// container being destroyed. Under emulation a sandbox's boot takes 10 to
// 30 s, and the whole matrix (about 9 minutes here) does not fit the time
// the VM rows may add to make test; the other cells' steps are the
// provider's and the keep root's as on the docker row.
var appArmorCrashCells = map[string]bool{
	"create at create/provider-state": true,
	"run at boot/ready":               true,
	"destroy at destroy/discarded":    true,
}

// appArmorCrashCell picks the crash cells the row runs in the VM.
func appArmorCrashCell(cell crashCell) bool {
	switch os.Getenv(appArmorCrashEnv) {
	case "all":
		return true
	case "none":
		return false
	}
	return appArmorCrashCells[cell.String()]
}

// rowDockerAppArmor is the row's setup in the VM: the docker row, once
// the kernel and the engine are seen enforcing AppArmor and the engine's
// default is seen refusing.
func rowDockerAppArmor(t *testing.T, f *confFixtures) confEnv {
	require.True(t, inAppArmorVM(), "the AppArmor row runs in its VM only (runConfRow boots it)")
	lsm, _ := os.ReadFile("/sys/kernel/security/lsm")
	enabled, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	kernel := fmt.Sprintf("LSMs %s, AppArmor enabled: %s", strings.TrimSpace(string(lsm)), strings.TrimSpace(string(enabled)))
	require.Contains(t, strings.Split(strings.TrimSpace(string(lsm)), ","), "apparmor", "the kernel runs AppArmor: %s", kernel)
	require.Equal(t, "Y", strings.TrimSpace(string(enabled)), "AppArmor is enabled: %s", kernel)
	env := rowDocker(t, f)
	engine, err := needDocker(t).Docker(context.Background(), "info", "--format", "{{json .SecurityOptions}}")
	require.NoError(t, err)
	require.Contains(t, engine, "name=apparmor", "the engine confines containers with AppArmor")
	t.Logf("%s; the engine's security options: %s", kernel, engine)
	vmFacts.mu.Lock()
	vmFacts.Kernel, vmFacts.Engine = kernel, engine
	vmFacts.Checks = map[string]string{}
	vmFacts.mu.Unlock()

	// Before any sandbox: the provider loads oac-guest when it may, and
	// the kernel keeps it loaded.
	ok := t.Run(requireRefusesCheck, func(t *testing.T) { requireRefusesWithoutProfile(t, env) })
	vmFacts.mu.Lock()
	vmFacts.Checks[requireRefusesCheck] = outcome(ok)
	vmFacts.mu.Unlock()

	env.bootTimeout = appArmorVMBoot
	env.onLive = recordConfinement
	env.crashCell = appArmorCrashCell
	return env
}

func outcome(ok bool) string { return map[bool]string{true: "pass", false: "FAIL"}[ok] }

// loadedProfiles lists the kernel's loaded AppArmor profiles.
func loadedProfiles(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	require.NoError(t, err, "the kernel's AppArmor profiles")
	return strings.TrimSpace(string(b))
}

// requireRefusesWithoutProfile: --docker-apparmor require uses only a
// profile the kernel has; with none, the sandbox fails with a named code
// before anything is created, and nothing is left.
func requireRefusesWithoutProfile(t *testing.T, env confEnv) {
	before := loadedProfiles(t)
	require.NotContains(t, before, guestProfile+" (", "no %s profile is loaded yet: the check needs the engine's default alone", guestProfile)
	d := newDockerRecorder(t)
	name := uniqueName("aa-require")
	spec := env.spec
	spec.name, spec.bootstrap, spec.hosts = name, confBootstrap(name, nil), publicHosts
	spec.env = append(append([]string(nil), spec.env...), d.env...)
	spec.args = append(append([]string(nil), spec.args...), "--docker", bins.dockerRec, "--docker-apparmor", "require")
	s := startShim(t, spec)
	failed := s.exitFailed(api.CodeAppArmorMissing, appArmorVMBoot)
	t.Logf("the failure: %s", failed.Message)
	vmFacts.mu.Lock()
	vmFacts.Refusal = fmt.Sprintf("%s (exit %d): %s", failed.Code, s.cmd.ProcessState.ExitCode(), failed.Message)
	vmFacts.mu.Unlock()
	assert.Contains(t, failed.Message, guestProfile, "the failure names the profile to install")
	for _, c := range d.calls(t) {
		assert.NotContains(t, []string{"run", "create"}, c[0], "nothing was created: docker %s", strings.Join(c, " "))
	}
	assert.Empty(t, dockerContainers(t, name), "no container")
	assert.NoDirExists(t, runDir(name), "no state directory")
	for _, pid := range hostProcs(name) {
		if pid != os.Getpid() {
			t.Errorf("process %d names the sandbox: %q", pid, readCmdline(pid))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	assert.NotContains(t, string(mounts), name, "no mount")
	assert.Equal(t, before, loadedProfiles(t), "require loads no profile")
}

// recordConfinement keeps the first sandbox's confinement as the kernel
// reports it, and the profiles loaded then.
func recordConfinement(t *testing.T, c *confCase) {
	selfNS, _ := os.Readlink("/proc/self/ns/pid")
	var procs []vmProc
	for _, p := range c.procs {
		label, err := os.ReadFile(fmt.Sprintf("/proc/%d/attr/current", p.pid))
		if err != nil {
			continue // it ended
		}
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.pid))
		procs = append(procs, vmProc{PID: p.pid, Comm: p.comm, Label: strings.TrimSpace(strings.TrimRight(string(label), "\x00")), Contained: ns != selfNS})
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].PID < procs[j].PID })
	profiles := loadedProfiles(t)
	t.Logf("AppArmor profiles loaded:\n%s\nthe sandbox's processes (/proc/PID/attr/current):\n%s", profiles, confinementText(procs))
	vmFacts.mu.Lock()
	defer vmFacts.mu.Unlock()
	if vmFacts.Confinement == nil {
		vmFacts.Profiles, vmFacts.Confinement = profiles, procs
	}
}

func confinementText(procs []vmProc) string {
	var b strings.Builder
	for _, p := range procs {
		where := "host"
		if p.Contained {
			where = "container"
		}
		fmt.Fprintf(&b, "  %d %s (%s): %s\n", p.PID, p.Comm, where, p.Label)
	}
	return b.String()
}

// writeVMRowResults writes the row's results for the host (in the VM).
func writeVMRowResults(t *testing.T, res *confResults) {
	dir := os.Getenv(appArmorVMEnv)
	if dir == "" {
		return
	}
	vmFacts.mu.Lock()
	out := vmFacts.vmRowResults
	vmFacts.mu.Unlock()
	res.mu.Lock()
	out.Cells, out.Note = res.cells[appArmorRow], res.notes[appArmorRow]
	out.Crash = map[string]string{}
	for cell, rows := range res.crash {
		if o, ok := rows[appArmorRow]; ok {
			out.Crash[cell] = o
		}
	}
	res.mu.Unlock()
	b, err := json.MarshalIndent(out, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644))
}

// appArmorVMMissing says what this host lacks to run the row's VM ("":
// nothing).
func appArmorVMMissing() string {
	if m := hostvm.Missing(); m != "" {
		return m
	}
	if _, err := exec.LookPath("apparmor_parser"); err != nil {
		return "apparmor_parser is not installed (the VM's Docker engine loads docker-default with it): apt-get install apparmor (or run make deps)"
	}
	if m := dockerd.Missing(); m != "" {
		return m
	}
	if _, err := os.Stat(filepath.Join(kernelCache(), "modules", "modules.dep")); err != nil {
		return "no kernel cache at " + kernelCache() + ": run make kernel"
	}
	return ""
}

// appArmorVM is the row's VM run, one per test binary: under emulation
// it takes minutes, so a run of the whole suite starts it with the run
// (TestMain), beside the tests before TestConformance, and the row
// collects it; a run that names tests starts it when the row runs.
// TestMain stops it.
var appArmorVM struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	cfg    hostvm.Config
	res    *hostvm.Result
	err    error
}

// startAppArmorVM starts the VM unless it was; check appArmorVMMissing
// first.
func startAppArmorVM() chan struct{} {
	appArmorVM.mu.Lock()
	defer appArmorVM.mu.Unlock()
	if appArmorVM.done != nil {
		return appArmorVM.done
	}
	ctx, cancel := context.WithCancel(context.Background())
	appArmorVM.cancel, appArmorVM.done = cancel, make(chan struct{})
	go func() {
		defer close(appArmorVM.done)
		cfg, res, err := runAppArmorVM(ctx)
		appArmorVM.mu.Lock()
		appArmorVM.cfg, appArmorVM.res, appArmorVM.err = cfg, res, err
		appArmorVM.mu.Unlock()
	}()
	return appArmorVM.done
}

// startAppArmorVMEarly starts the VM when the whole suite runs (no
// -test.run or -test.skip) on a host that can run it (TestMain).
func startAppArmorVMEarly() {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.run") || strings.HasPrefix(a, "-test.skip") || strings.HasPrefix(a, "-test.list") {
			return
		}
	}
	if !inAppArmorVM() && appArmorVMMissing() == "" {
		startAppArmorVM()
	}
}

// stopAppArmorVM ends the VM if it still runs and waits for it (TestMain).
func stopAppArmorVM() {
	appArmorVM.mu.Lock()
	cancel, done := appArmorVM.cancel, appArmorVM.done
	appArmorVM.mu.Unlock()
	if done != nil {
		cancel()
		<-done
	}
}

// runAppArmorVM runs this test binary on the row in the VM.
func runAppArmorVM(ctx context.Context) (hostvm.Config, *hostvm.Result, error) {
	var cfg hostvm.Config
	work, err := os.MkdirTemp(bins.dir, "apparmor-vm-")
	if err != nil {
		return cfg, nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return cfg, nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return cfg, nil, err
	}
	modules, err := filepath.EvalSymlinks(filepath.Join(kernelCache(), "modules"))
	if err != nil {
		return cfg, nil, err
	}
	cfg = hostvm.Config{
		Kernel: filepath.Join(kernelCache(), "vmlinuz"), Modules: modules,
		Work: work, MemoryMiB: 4096, CPUs: 2, Timeout: appArmorVMTimeout,
	}
	cfg.Script = appArmorVMScript(cfg, exe, cwd, appArmorRow)
	res, err := hostvm.Run(ctx, cfg)
	return cfg, res, err
}

// takeAppArmorVM waits for the VM and takes what it gave: the next
// TestConformance (go test -count) starts another.
func takeAppArmorVM(t *testing.T) (hostvm.Config, *hostvm.Result, error) {
	t.Helper()
	select {
	case <-startAppArmorVM():
	case <-time.After(appArmorVMTimeout + time.Minute):
		t.Fatalf("the AppArmor VM did not end within %s", appArmorVMTimeout+time.Minute)
	}
	appArmorVM.mu.Lock()
	defer appArmorVM.mu.Unlock()
	cfg, r, err := appArmorVM.cfg, appArmorVM.res, appArmorVM.err
	appArmorVM.done, appArmorVM.cfg, appArmorVM.res, appArmorVM.err = nil, hostvm.Config{}, nil, nil
	return cfg, r, err
}

// runRowInAppArmorVM waits for the row's run in the VM and sets its cells
// from what the run there found; it reports whether it got that far.
func runRowInAppArmorVM(t *testing.T, row confRow, res *confResults) bool {
	m := appArmorVMMissing()
	need(t, m == "", m)
	cfg, r, err := takeAppArmorVM(t)
	if r != nil {
		t.Logf("the VM (%d MiB, %d vCPUs under TCG) ran for %s:\n%s", cfg.MemoryMiB, cfg.CPUs, r.Took.Round(time.Second), r.Output)
		for _, pid := range r.Pids {
			_, comm := procStat(pid)
			assert.NotContains(t, []string{"qemu-system-x86", "virtiofsd"}, comm, "process %d the VM started is gone", pid)
		}
	}
	var log []byte
	if cfg.Work != "" {
		t.Cleanup(func() { os.RemoveAll(cfg.Work) })
		log, _ = os.ReadFile(filepath.Join(cfg.Work, "e2e.log"))
		if p := os.Getenv("OAC_E2E_APPARMOR_LOG"); p != "" {
			// The run's whole log, kept (the work directory is not).
			require.NoError(t, os.WriteFile(p, log, 0o644))
		}
	}
	require.NoError(t, err, "the VM; the e2e run's end:\n%s", lastLines(string(log), 60))
	b, err := os.ReadFile(filepath.Join(cfg.Work, "results.json"))
	require.NoError(t, err, "the run in the VM wrote no results; its end:\n%s", lastLines(string(log), 60))
	var got vmRowResults
	require.NoError(t, json.Unmarshal(b, &got))

	if got.Kernel == "" {
		// The row's own setup stopped before any cell: its output says why.
		t.Errorf("the row's setup in the VM did not finish:\n%s", testOutput(string(log), "TestConformance/rows/"+testName(row.name)))
	}
	t.Logf("in the VM: %s; the engine's security options: %s", got.Kernel, got.Engine)
	t.Logf("AppArmor profiles loaded while the row's sandbox ran:\n%s", got.Profiles)
	t.Logf("the sandbox's processes as the kernel confines them (/proc/PID/attr/current):\n%s", confinementText(got.Confinement))
	prefix := "TestConformance/rows/" + testName(row.name) + "/"
	mirror := func(name, o string) {
		t.Run(name, func(t *testing.T) {
			switch o {
			case "pass":
				t.Logf("in the VM: %s", testResult(string(log), prefix+testName(name)))
			case "":
				t.Errorf("not run in the VM; the run's end:\n%s", lastLines(string(log), 40))
			default:
				t.Errorf("%s in the VM:\n%s", o, testOutput(string(log), prefix+testName(name)))
			}
		})
	}
	t.Logf("with no %s profile loaded, --docker-apparmor require failed %s", guestProfile, got.Refusal)
	mirror(requireRefusesCheck, got.Checks[requireRefusesCheck])
	t.Run("the kernel confines the guest with "+guestProfile+" (enforce)", func(t *testing.T) {
		assert.Contains(t, strings.Split(got.Profiles, "\n"), guestProfile+" (enforce)", "the provider's profile is loaded, enforcing")
		var contained []vmProc
		for _, p := range got.Confinement {
			if p.Contained {
				contained = append(contained, p)
			}
		}
		require.NotEmpty(t, contained, "the container's processes were seen")
		for _, p := range contained {
			if p.Comm == "oac-guest" {
				assert.Equal(t, guestProfile+" (enforce)", p.Label, "the guest agent's confinement")
			}
			assert.True(t, strings.HasSuffix(p.Label, " (enforce)"), "process %d %s is confined, enforcing: %s", p.PID, p.Comm, p.Label)
		}
	})
	for _, p := range confPromises {
		o := got.Cells[p.name]
		mirror(p.name, o)
		if o == "" {
			o = "FAIL"
		}
		res.set(row.name, p.name, o)
	}
	for _, cell := range crashCells() {
		if !appArmorCrashCell(cell) {
			res.setCrash(row.name, cell.String(), "not run")
			continue
		}
		o := got.Crash[cell.String()]
		mirror("crash "+cell.String(), o)
		if o == "" {
			o = "FAIL"
		}
		res.setCrash(row.name, cell.String(), o)
	}
	if got.Note != "" {
		res.note(row.name, got.Note)
	}
	return true
}

// appArmorVMScript runs this test binary in the VM on the row alone, as
// the host's go test runs it (its directory, the kernel cache), with the
// host's binaries.
func appArmorVMScript(cfg hostvm.Config, exe, cwd, row string) string {
	env := []string{
		appArmorVMEnv + "=" + cfg.Work,
		"OAC_E2E_BINS=" + cfg.GuestPath(bins.dir),
		"OAC_KERNEL_CACHE=" + cfg.GuestPath(kernelCache()),
		"CI=" + os.Getenv("CI"),
		appArmorCrashEnv + "=" + os.Getenv(appArmorCrashEnv),
	}
	var quoted []string
	for _, e := range env {
		quoted = append(quoted, shellQuote(e))
	}
	run := "^TestConformance$/^rows$/^" + regexp.QuoteMeta(testName(row)) + "$"
	return fmt.Sprintf(`echo "kernel $(uname -r); LSMs $(cat /sys/kernel/security/lsm); AppArmor enabled: $(cat /sys/module/apparmor/parameters/enabled)"
cd %s || exit 2
export %s
%s -test.run %s -test.count=1 -test.v -test.timeout=%s >%s 2>&1
echo "the e2e run in the VM exited $?"
`, shellQuote(cfg.GuestPath(cwd)), strings.Join(quoted, " "), shellQuote(cfg.GuestPath(exe)), shellQuote(run),
		appArmorVMTimeout-time.Minute, shellQuote(filepath.Join(cfg.Work, "e2e.log")))
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// testName is a subtest's name as go test prints it.
func testName(name string) string { return strings.ReplaceAll(name, " ", "_") }

// testOutput is what go test -v printed of the test called name and its
// subtests: the lines under its === headers, and its --- result.
func testOutput(log, name string) string {
	var out []string
	cur := ""
	mine := func(n string) bool { return n == name || strings.HasPrefix(n, name+"/") }
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if h, ok := strings.CutPrefix(line, "=== "); ok {
			f := strings.Fields(h)
			if len(f) == 2 {
				cur = f[1]
			}
			continue
		}
		if r, ok := strings.CutPrefix(trimmed, "--- "); ok {
			f := strings.Fields(r)
			if len(f) >= 2 && mine(f[1]) {
				out = append(out, line)
			}
			cur = ""
			continue
		}
		if mine(cur) {
			out = append(out, line)
		}
	}
	return lastLines(strings.Join(out, "\n"), 200)
}

// testResult is go test -v's result line for the test called name
// ("--- PASS: name (12.34s)").
func testResult(log, name string) string {
	for _, line := range strings.Split(log, "\n") {
		if r, ok := strings.CutPrefix(strings.TrimSpace(line), "--- "); ok {
			if f := strings.Fields(r); len(f) >= 2 && f[1] == name {
				return strings.TrimSpace(line)
			}
		}
	}
	return "no result line"
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestTheAppArmorRowReadsEachSubtestOfTheRunInTheVM(t *testing.T) {
	log := `=== RUN   TestConformance/rows/r
=== RUN   TestConformance/rows/r/a_column
    conformance_test.go:1: boot
=== RUN   TestConformance/rows/r/crash_run_at_boot/ready
    conformance_crash_test.go:2: killed
=== NAME  TestConformance/rows/r/a_column
    conformance_test.go:3: late line
        --- FAIL: TestConformance/rows/r/a_column (12.50s)
        --- PASS: TestConformance/rows/r/crash_run_at_boot/ready (30.18s)
`
	assert.Equal(t, "    conformance_test.go:1: boot\n    conformance_test.go:3: late line\n        --- FAIL: TestConformance/rows/r/a_column (12.50s)",
		testOutput(log, "TestConformance/rows/r/"+testName("a column")))
	assert.Equal(t, "--- PASS: TestConformance/rows/r/crash_run_at_boot/ready (30.18s)", testResult(log, "TestConformance/rows/r/crash_run_at_boot/ready"))
	assert.Equal(t, "no result line", testResult(log, "TestConformance/rows/r/none"))
}
