//go:build linux

package e2e

import (
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
	"github.com/oac/sandbox-agent/host/provider/bwrap"
	"github.com/oac/sandbox-agent/internal/hostvm"
)

// The rootless bwrap provider on an Ubuntu desktop, under Ubuntu's own
// AppArmor profiles for bubblewrap, in the VM of apparmor_vm_test.go
// (internal/hostvm: Debian's cloud kernel, which enforces AppArmor, over
// this machine's userspace), as the unprivileged users of rootless_test.go.
//
// Ubuntu's bwrap-userns-restrict runs bwrap's children under unpriv_bwrap,
// whose "audit deny capability" Debian's kernel enforces as Ubuntu's does:
// there the provider refuses before creating anything and check names the
// fix. The profile oac ships for a bwrap of its own
// (examples/apparmor/oac-bwrap, Ubuntu's per-application form) runs the
// rootless row's columns, with Debian 12's bubblewrap 0.8.0 and Debian
// 13's 0.12.0 as that bwrap. Debian 12's apparmor_parser (3.0) cannot read
// these profiles (abi 4.0, "userns,"): Debian 13's packages are fetched
// with apt-get download into ../.cache/debian13 and unpacked there, never
// installed; in the VM the parser runs with Debian 13's libc beside it, and
// bubblewrap 0.12.0 after that libc is copied over the VM's memory-backed
// root. What this cannot show is Ubuntu's own kernel change, the userns
// rule and kernel.apparmor_restrict_unprivileged_userns (docs/ubuntu.md).

const (
	// bwrapAAVMEnv is set in the VM to the work directory the run there
	// writes its results to.
	bwrapAAVMEnv = "OAC_E2E_BWRAP_APPARMOR_VM"
	// debian13Env names the unpacked Debian 13 packages in the VM.
	debian13Env = "OAC_E2E_DEBIAN13"
	// bwrapAAVMTimeout bounds the VM; the run inside ends a minute
	// earlier, so that its own timeout says which test hung.
	bwrapAAVMTimeout = 12 * time.Minute
	// restrictProfile is Ubuntu's profile for /usr/bin/bwrap.
	restrictProfile = "bwrap-userns-restrict"
	// plainPATH does not name the app's own bwrap: oac-shim takes it
	// from /opt/oac/bin by itself.
	plainPATH = "PATH=/usr/local/bin:/usr/bin:/bin"
)

// The checks of the run in the VM, by name; the host mirrors each.
const (
	checkRestrictRefuses = "bwrap-userns-restrict: check and run refuse before creating anything, naming oac-bwrap"
	checkRow08           = "oac-bwrap, bubblewrap 0.8.0: the rootless row"
	checkRow012          = "oac-bwrap, bubblewrap 0.12.0: the rootless row"
)

// debian13Pkgs: the parser and the profiles (bwrap-userns-restrict is in
// apparmor-profiles' extra-profiles), bubblewrap, and the libraries they
// need that Debian 12's are too old for.
var debian13Pkgs = []string{"apparmor", "apparmor-profiles", "libapparmor1", "bubblewrap", "libc6", "libcap2", "libselinux1", "libpcre2-8-0"}

// bwrapVMResults is what the run in the VM writes for the host.
type bwrapVMResults struct {
	// Checks are the checks' outcomes; Cells the rows' columns (row ->
	// column -> outcome).
	Checks map[string]string            `json:"checks"`
	Cells  map[string]map[string]string `json:"cells"`
	// Facts are what the host logs: versions, profiles, labels, check's
	// lines, the kernel's denials.
	Facts []string `json:"facts"`
}

var bwrapVM struct {
	mu  sync.Mutex
	out bwrapVMResults
}

func bwrapVMFact(format string, a ...any) {
	bwrapVM.mu.Lock()
	defer bwrapVM.mu.Unlock()
	bwrapVM.out.Facts = append(bwrapVM.out.Facts, fmt.Sprintf(format, a...))
}

func TestRootlessBwrapUnderUbuntusAppArmorProfiles(t *testing.T) {
	if work := os.Getenv(bwrapAAVMEnv); work != "" {
		bwrapAppArmorInVM(t, work)
		return
	}
	t.Parallel()
	needRootless(t)
	missing := hostvm.Missing()
	need(t, missing == "", missing)
	_, err := os.Stat(filepath.Join(kernelCache(), "modules", "modules.dep"))
	need(t, err == nil, "no kernel cache at "+kernelCache()+": run make kernel")
	deb := debian13(t)
	vmSlots <- struct{}{}
	defer func() { <-vmSlots }()

	work, err := os.MkdirTemp(bins.dir, "bwrap-apparmor-vm-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(work) })
	exe, err := os.Executable()
	require.NoError(t, err)
	cwd, err := os.Getwd()
	require.NoError(t, err)
	cfg := hostvm.Config{
		Kernel: filepath.Join(kernelCache(), "vmlinuz"), Modules: filepath.Join(kernelCache(), "modules"),
		Work: work, MemoryMiB: 3072, CPUs: 2, Timeout: bwrapAAVMTimeout,
	}
	cfg.Modules, err = filepath.EvalSymlinks(cfg.Modules)
	require.NoError(t, err)
	env := []string{
		bwrapAAVMEnv + "=" + work,
		debian13Env + "=" + cfg.GuestPath(deb),
		"OAC_E2E_BINS=" + cfg.GuestPath(bins.dir),
		"OAC_KERNEL_CACHE=" + cfg.GuestPath(kernelCache()),
		"CI=" + os.Getenv("CI"),
	}
	for i, e := range env {
		env[i] = shellQuote(e)
	}
	cfg.Script = fmt.Sprintf(`echo "kernel $(uname -r); LSMs $(cat /sys/kernel/security/lsm); AppArmor enabled: $(cat /sys/module/apparmor/parameters/enabled)"
cd %s || exit 2
export %s
%s -test.run '^TestRootlessBwrapUnderUbuntusAppArmorProfiles$' -test.count=1 -test.v -test.timeout=%s >%s 2>&1
echo "the e2e run in the VM exited $?"
`, shellQuote(cfg.GuestPath(cwd)), strings.Join(env, " "), shellQuote(cfg.GuestPath(exe)), bwrapAAVMTimeout-time.Minute,
		shellQuote(filepath.Join(work, "e2e.log")))

	r, err := hostvm.Run(context.Background(), cfg)
	if r != nil {
		t.Logf("the VM (%d MiB, %d vCPUs under TCG) ran for %s:\n%s", cfg.MemoryMiB, cfg.CPUs, r.Took.Round(time.Second), r.Output)
		for _, pid := range r.Pids {
			_, comm := procStat(pid)
			assert.NotContains(t, []string{"qemu-system-x86", "virtiofsd"}, comm, "process %d the VM started is gone", pid)
		}
	}
	log, _ := os.ReadFile(filepath.Join(work, "e2e.log"))
	require.NoError(t, err, "the VM; the e2e run's end:\n%s", lastLines(string(log), 60))
	b, err := os.ReadFile(filepath.Join(work, "results.json"))
	require.NoError(t, err, "the run in the VM wrote no results; its end:\n%s", lastLines(string(log), 60))
	var got bwrapVMResults
	require.NoError(t, json.Unmarshal(b, &got))
	t.Logf("in the VM:\n  %s", strings.Join(got.Facts, "\n  "))

	prefix := "TestRootlessBwrapUnderUbuntusAppArmorProfiles/"
	mirror := func(t *testing.T, name, o, where string) {
		t.Run(name, func(t *testing.T) {
			switch o {
			case "pass":
			case "":
				t.Errorf("not run in the VM; the run's end:\n%s", lastLines(string(log), 40))
			default:
				t.Errorf("%s in the VM:\n%s", o, testOutput(string(log), prefix+testName(where)))
			}
		})
	}
	mirror(t, checkRestrictRefuses, got.Checks[checkRestrictRefuses], checkRestrictRefuses)
	for _, row := range []string{checkRow08, checkRow012} {
		t.Run(row, func(t *testing.T) {
			mirror(t, "check sees oac-bwrap; bwrap, the agent and the workload run under it", got.Checks[row], row)
			for _, p := range confPromises {
				mirror(t, p.name, got.Cells[row][p.name], row+"/row/"+p.name)
			}
		})
	}
	var table []string
	for _, row := range []string{checkRow08, checkRow012} {
		for _, p := range confPromises {
			table = append(table, fmt.Sprintf("  %-40s %-60s %s", row, p.name, orDash(got.Cells[row][p.name])))
		}
	}
	t.Logf("the rootless row in the VM:\n%s", strings.Join(table, "\n"))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// debian13 returns the directory Debian 13's packages are unpacked in
// (../.cache/debian13/root), fetching them once: apt-get with lists, cache
// and sources of its own, so this machine's apt state is not touched.
func debian13(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("../.cache/debian13")
	root := filepath.Join(dir, "root")
	if _, err := os.Stat(filepath.Join(root, "usr/share/apparmor/extra-profiles", restrictProfile)); err == nil {
		return root
	}
	_, err := exec.LookPath("apt-get")
	need(t, err == nil, "apt-get is missing: Debian 13's apparmor and bubblewrap are fetched with it")
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "debian13-")
	if err != nil {
		require.NoError(t, os.MkdirAll(filepath.Dir(dir), 0o755))
		tmp, err = os.MkdirTemp(filepath.Dir(dir), "debian13-")
	}
	require.NoError(t, err)
	defer os.RemoveAll(tmp)
	for _, d := range []string{"lists/partial", "archives/partial", "cache", "debs", "root"} {
		require.NoError(t, os.MkdirAll(filepath.Join(tmp, d), 0o755))
	}
	sources := filepath.Join(tmp, "sources.list")
	require.NoError(t, os.WriteFile(sources, []byte("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main\n"), 0o644))
	opts := []string{
		"-o", "Dir::Etc::sourcelist=" + sources, "-o", "Dir::Etc::sourceparts=-",
		"-o", "Dir::State::Lists=" + filepath.Join(tmp, "lists"), "-o", "Dir::Cache=" + filepath.Join(tmp, "cache"),
		"-o", "Dir::Cache::Archives=" + filepath.Join(tmp, "archives"), "-o", "Acquire::Languages=none",
		"-o", "APT::Sandbox::User=root",
	}
	apt := func(args ...string) {
		cmd := exec.Command("apt-get", append(append([]string(nil), opts...), args...)...)
		cmd.Dir = filepath.Join(tmp, "debs")
		out, err := cmd.CombinedOutput()
		need(t, err == nil, fmt.Sprintf("apt-get %s (Debian 13's packages): %v: %s", args[0], err, lastLines(string(out), 10)))
	}
	apt("update")
	apt(append([]string{"download"}, debian13Pkgs...)...)
	debs, err := filepath.Glob(filepath.Join(tmp, "debs", "*.deb"))
	require.NoError(t, err)
	require.Len(t, debs, len(debian13Pkgs), "one .deb per package")
	for _, d := range debs {
		out, err := exec.Command("dpkg-deb", "-x", d, filepath.Join(tmp, "root")).CombinedOutput()
		require.NoError(t, err, "dpkg-deb -x %s: %s", d, out)
	}
	names := make([]string, 0, len(debs))
	for _, d := range debs {
		names = append(names, filepath.Base(d))
	}
	sort.Strings(names)
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "root", "PACKAGES"), []byte(strings.Join(names, "\n")+"\n"), 0o644))
	os.RemoveAll(dir)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.Rename(filepath.Join(tmp, "root"), root))
	return root
}

// bwrapAppArmorInVM is the run in the VM.
func bwrapAppArmorInVM(t *testing.T, work string) {
	bwrapVM.out = bwrapVMResults{Checks: map[string]string{}, Cells: map[string]map[string]string{}}
	defer func() {
		bwrapVM.mu.Lock()
		defer bwrapVM.mu.Unlock()
		b, err := json.MarshalIndent(bwrapVM.out, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(work, "results.json"), b, 0o644))
	}()
	deb := os.Getenv(debian13Env)
	require.NotEmpty(t, deb, "%s names Debian 13's unpacked packages", debian13Env)
	enabled, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	require.Equal(t, "Y", strings.TrimSpace(string(enabled)), "the kernel enforces AppArmor")
	needRootless(t)
	pkgs, _ := os.ReadFile(filepath.Join(deb, "PACKAGES"))
	bwrapVMFact("Debian 13's packages: %s", strings.Join(strings.Fields(string(pkgs)), " "))
	bwrapVMFact("parser: %s", firstLine(debian13Parser(t, deb, "--version")))

	// Ubuntu's profile, installed and loaded as Ubuntu does (25.04 loads
	// it by default).
	installFile(t, filepath.Join(deb, "usr/share/apparmor/extra-profiles", restrictProfile), "/etc/apparmor.d/"+restrictProfile, 0o644)
	debian13Parser(t, deb, "-r", "/etc/apparmor.d/"+restrictProfile)
	ok := t.Run(checkRestrictRefuses, restrictRefuses)
	bwrapVM.out.Checks[checkRestrictRefuses] = outcome(ok)

	// The VM shows the kernel's modules (virtio-fs) under /usr, which the
	// default root binds: a door to the host no desktop has. In the guest's
	// user namespace that mount is locked, so the guest covers it with an
	// empty tmpfs instead of detaching it, and the workload's door scan
	// still lists it. The capture's modules are loaded first, then it goes.
	unmountVMModules(t)

	// The app's own bwrap and its profile, with bwrap-userns-restrict
	// still on /usr/bin/bwrap: Debian 12's bubblewrap first.
	installFile(t, "/usr/bin/bwrap", bwrap.OwnBwrap, 0o755)
	installFile(t, "../examples/apparmor/oac-bwrap", "/etc/apparmor.d/"+bwrap.OwnBwrapProfile, 0o644)
	debian13Parser(t, deb, "-r", "/etc/apparmor.d/"+bwrap.OwnBwrapProfile)
	runOwnBwrapRow(t, checkRow08, "0.8.0")

	// Debian 13's bubblewrap needs Debian 13's libc: one static busybox
	// swaps ld.so and libc together (no dynamic program may run between).
	lib := filepath.Join(deb, "usr/lib/x86_64-linux-gnu")
	out, err := exec.Command("busybox", "sh", "-c", `cd "$1" && for f in *.so*; do busybox rm -f "/usr/lib/x86_64-linux-gnu/$f"; done && busybox cp -a *.so* /usr/lib/x86_64-linux-gnu/`, "swap", lib).CombinedOutput()
	require.NoError(t, err, "copy Debian 13's libraries into the VM's root: %s", out)
	require.NoError(t, os.Remove(bwrap.OwnBwrap))
	installFile(t, filepath.Join(deb, "usr/bin/bwrap"), bwrap.OwnBwrap, 0o755)
	runOwnBwrapRow(t, checkRow012, "0.12.0")
}

// restrictRefuses: under bwrap-userns-restrict, check says why the
// provider cannot run and what to install, and run refuses with the same
// before it creates anything; the kernel logged the probe's denial.
func restrictRefuses(t *testing.T) {
	profiles := loadedProfiles(t)
	require.Contains(t, profiles, "unpriv_bwrap (enforce)")
	bwrapVMFact("profiles: %s", strings.ReplaceAll(profiles, "\n", ", "))
	for _, u := range []struct{ user, flag string }{{subIDUser, ""}, {singleUser, "--single-uid"}} {
		argv := []string{bins.shim, "check"}
		if u.flag != "" {
			argv = append(argv, u.flag)
		}
		out, err := exec.Command("setpriv", append([]string{"--reuid", u.user, "--regid", u.user, "--init-groups", "--reset-env"}, argv...)...).CombinedOutput()
		line := grepLine(string(out), "bwrap: ")
		bwrapVMFact("check as %s %s (exit %v): %s", u.user, u.flag, err, line)
		assert.Contains(t, line, "bwrap: unavailable: ")
		assert.Contains(t, line, `AppArmor runs bwrap's children without capabilities (the probe ran as "bwrap//&unpriv_bwrap (enforce)"`)
		assert.Contains(t, line, "the profile in /etc/apparmor.d/bwrap-userns-restrict confines /usr/bin/bwrap")
		assert.Contains(t, line, "sudo install -D -m 0755 /usr/bin/bwrap /opt/oac/bin/bwrap")
		assert.Contains(t, line, "sudo install -m 0644 examples/apparmor/oac-bwrap /etc/apparmor.d/oac-bwrap && sudo apparmor_parser -r /etc/apparmor.d/oac-bwrap")
		assert.Contains(t, line, "oac-shim takes that bwrap before any in PATH")
		assert.NotContains(t, line, "install the bwrap-userns-restrict")
	}
	kmsg := kernelLog(t)
	denial := grepLine(kmsg, `apparmor="DENIED" operation="capable" profile="unpriv_bwrap"`)
	bwrapVMFact("the kernel: %s", denial)
	assert.Contains(t, denial, `comm="oac-caps-probe"`, "the probe was refused by unpriv_bwrap")

	for _, u := range []struct {
		user string
		args []string
	}{{subIDUser, nil}, {singleUser, []string{"--single-uid"}}} {
		name := uniqueName("aa-restrict")
		s := startShim(t, sandboxSpec{name: name, user: u.user, args: u.args, bootstrap: daemon("exec sleep 1000")})
		failed := s.exitFailed(api.CodeProviderUnavailable, appArmorVMBoot)
		assert.Contains(t, failed.Message, "AppArmor runs bwrap's children without capabilities")
		assert.Contains(t, failed.Message, "oac-bwrap")
		bwrapVMFact("run as %s: failed %s", u.user, api.CodeProviderUnavailable)
		for _, state := range []string{os.TempDir(), "/run"} {
			dirs, _ := filepath.Glob(filepath.Join(state, "oac*", "sandboxes", name))
			assert.Empty(t, dirs, "no state directory")
		}
		for _, pid := range hostProcs(name) {
			if pid != os.Getpid() {
				t.Errorf("process %d names the sandbox: %q", pid, readCmdline(pid))
			}
		}
	}
}

// runOwnBwrapRow runs the rootless row with the app's own bwrap installed
// at /opt/oac/bin (PATH names /usr/bin's only: oac-shim takes it by
// itself), after check has seen the guest run as oac-bwrap.
func runOwnBwrapRow(t *testing.T, name, version string) {
	ok := t.Run(name, func(t *testing.T) {
		out, err := exec.Command(bwrap.OwnBwrap, "--version").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), version)
		bwrapVMFact("%s: %s", bwrap.OwnBwrap, strings.TrimSpace(string(out)))
		profiles := loadedProfiles(t)
		require.Contains(t, profiles, bwrap.OwnBwrapProfile+" (unconfined)")
		require.Contains(t, profiles, "unpriv_bwrap (enforce)", "Ubuntu's profile stays on /usr/bin/bwrap")
		out, _ = exec.Command("setpriv", "--reuid", subIDUser, "--regid", subIDUser, "--init-groups", "--reset-env",
			"env", plainPATH, bins.shim, "check").CombinedOutput()
		line := grepLine(string(out), "bwrap: ")
		bwrapVMFact("check as %s: %s", subIDUser, line)
		require.Contains(t, line, "bwrap: available (rootless")
		require.Contains(t, line, "AppArmor: /opt/oac/bin/bwrap runs the guest as oac-bwrap (unconfined)")

		fix := newConfFixtures(t)
		res := newConfResults()
		row := confRow{name: name, setup: func(t *testing.T, f *confFixtures) confEnv {
			env := rowBwrapRootless(t, f)
			env.spec.env = append(env.spec.env, plainPATH)
			env.bootTimeout = appArmorVMBoot
			env.onLive = recordOwnBwrapLabels
			// Not the crash cells: the rootless row runs them on the
			// host, and the VM rows' time is bounded (a killed shim
			// leaves what it leaves whatever the profile).
			env.crashCell = func(crashCell) bool { return false }
			return env
		}}
		t.Run("row", func(t *testing.T) { runConfRow(t, row, fix, res) })
		res.mu.Lock()
		bwrapVM.mu.Lock()
		bwrapVM.out.Cells[name] = res.cells[name]
		bwrapVM.mu.Unlock()
		res.mu.Unlock()
	})
	bwrapVM.out.Checks[name] = outcome(ok)
}

// recordOwnBwrapLabels: bwrap and the guest run as oac-bwrap, which
// leaves them their capabilities.
func recordOwnBwrapLabels(t *testing.T, c *confCase) {
	var seen []string
	for _, p := range c.procs {
		label, err := os.ReadFile(fmt.Sprintf("/proc/%d/attr/current", p.pid))
		if err != nil {
			continue
		}
		l := strings.TrimSpace(strings.TrimRight(string(label), "\x00"))
		seen = append(seen, fmt.Sprintf("%d %s: %s", p.pid, p.comm, l))
		if p.comm == "oac-guest" || p.comm == "bwrap" {
			assert.Equal(t, bwrap.OwnBwrapProfile+" (unconfined)", l, "process %d %s", p.pid, p.comm)
		}
	}
	bwrapVMFact("%s: the sandbox's processes: %s", c.row.name, strings.Join(seen, "; "))
}

// unmountVMModules loads the modules the guest's capture (nftables) and
// the run's public Link (veth) need, and unmounts the VM's modules share
// from /usr.
func unmountVMModules(t *testing.T) {
	t.Helper()
	out, err := exec.Command("modprobe", "-a", "nf_tables", "nft_chain_nat", "nft_redir", "nft_ct", "nft_objref", "veth").CombinedOutput()
	require.NoError(t, err, "modprobe: %s", out)
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && (strings.HasPrefix(f[4], "/usr/lib/modules/") || strings.HasPrefix(f[4], "/lib/modules/")) {
			out, err := exec.Command("umount", f[4]).CombinedOutput()
			require.NoError(t, err, "umount %s: %s", f[4], out)
			bwrapVMFact("unmounted the VM's modules share %s (the capture's modules loaded first)", f[4])
		}
	}
}

// debian13Parser runs Debian 13's apparmor_parser from deb, with its own libc and
// its own abi and tunables.
func debian13Parser(t *testing.T, deb string, args ...string) string {
	t.Helper()
	argv := append([]string{"--library-path", filepath.Join(deb, "usr/lib/x86_64-linux-gnu"), filepath.Join(deb, "usr/sbin/apparmor_parser"),
		"--config-file", filepath.Join(deb, "etc/apparmor/parser.conf"), "--base", filepath.Join(deb, "etc/apparmor.d"),
		"-I", filepath.Join(deb, "etc/apparmor.d")}, args...)
	out, err := exec.Command(filepath.Join(deb, "usr/lib64/ld-linux-x86-64.so.2"), argv...).CombinedOutput()
	require.NoError(t, err, "apparmor_parser %s: %s", strings.Join(args, " "), out)
	return string(out)
}

func installFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	require.NoError(t, os.WriteFile(dst, b, mode))
	require.NoError(t, os.Chmod(dst, mode))
}

// kernelLog is the kernel's log (the VM's own: nothing else writes it).
func kernelLog(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dmesg").CombinedOutput()
	require.NoError(t, err, "dmesg: %s", out)
	return string(out)
}

var dmesgStamp = regexp.MustCompile(`^\[[ 0-9.]+\] `)

// grepLine is the first line of s containing sub ("" none).
func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return dmesgStamp.ReplaceAllString(strings.TrimSpace(l), "")
		}
	}
	return ""
}

func firstLine(s string) string { line, _, _ := strings.Cut(s, "\n"); return line }
