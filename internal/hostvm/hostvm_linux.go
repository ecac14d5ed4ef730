package hostvm

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/initramfs"
)

// HostRoot is where the VM shows the host's root as it is: read-only,
// with the host's /tmp and /run, which the VM's own hide.
const HostRoot = "/run/hostvm/root"

// Defaults of Config.
const (
	DefaultMemoryMiB = 2048
	DefaultCPUs      = 1
	DefaultTimeout   = 10 * time.Minute
	DefaultBusybox   = "/bin/busybox"
	DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"
)

// Bounds on what Run keeps of the VM's output (the last bytes).
const (
	OutputLimit  = 1 << 20
	ConsoleLimit = 256 << 10
)

// exitMarker starts the console line stage 2 writes after the script.
const exitMarker = "hostvm: script exited "

// bootModules are what stage 1 needs before the host's root is mounted
// (dependencies are added from modules.dep); everything else is loaded on
// demand by the host's modprobe from the bound modules directory.
var bootModules = []string{"virtio_pci", "virtiofs", "overlay"}

// Config is one run.
type Config struct {
	// Kernel is an amd64 bzImage; Modules its /lib/modules/VERSION
	// directory (with modules.dep).
	Kernel, Modules string
	// Work is a host directory shared read-write, at the same path in the
	// VM.
	Work string
	// Script is run by the host's /bin/sh as root in the VM, with / as
	// its working directory and no standard input.
	Script string
	// Busybox is a statically linked busybox (Debian's busybox-static);
	// default DefaultBusybox.
	Busybox string
	// MemoryMiB and CPUs size the VM; defaults DefaultMemoryMiB and
	// DefaultCPUs.
	MemoryMiB, CPUs int
	// Timeout bounds the run from qemu's start to its exit; default
	// DefaultTimeout.
	Timeout time.Duration
	// Console, when set, gets the VM's console as it comes.
	Console io.Writer
}

// Result is what a run gave.
type Result struct {
	// Exit is the script's exit status.
	Exit int
	// Output is the script's standard output and error (the last
	// OutputLimit bytes).
	Output []byte
	// Console is the VM's console: stage messages and the kernel's
	// warnings (the last ConsoleLimit bytes).
	Console []byte
	// Took is from qemu's start to its exit.
	Took time.Duration
	// Pids are the processes Run started (qemu, then the virtiofsd of
	// each share), all ended and waited for.
	Pids []int
}

// Missing says what this machine lacks to run a VM ("" when nothing).
func Missing() string {
	return missing(DefaultBusybox, DefaultVirtiofsd)
}

func missing(busybox, virtiofsd string) string {
	if runtime.GOARCH != "amd64" {
		return "hostvm boots amd64 guests on an amd64 host only"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 is not installed: apt-get install qemu-system-x86 (or run make deps)"
	}
	if _, err := findVirtiofsd(virtiofsd); err != nil {
		return err.Error()
	}
	if err := checkStatic(busybox); err != nil {
		return err.Error()
	}
	if os.Geteuid() != 0 {
		return "virtiofsd shares the host's root and needs root: run as root"
	}
	return ""
}

func findVirtiofsd(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("virtiofsd is not installed (%s, from qemu-system-common, or virtiofsd in PATH): apt-get install qemu-system-x86 (or run make deps)", path)
}

// checkStatic refuses a busybox the initramfs could not run: one linked
// against a libc the initramfs does not have.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("no static busybox at %s (%v): apt-get install busybox-static (or run make deps)", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked and cannot run in an initramfs: apt-get install busybox-static (or run make deps)", path)
		}
	}
	return nil
}

// withDefaults checks c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Busybox == "" {
		c.Busybox = DefaultBusybox
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = DefaultMemoryMiB
	}
	if c.CPUs == 0 {
		c.CPUs = DefaultCPUs
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MemoryMiB < 256 || c.CPUs < 1 || c.Timeout < 0 {
		return c, fmt.Errorf("hostvm: %d MiB, %d CPUs, timeout %s: give at least 256 MiB, one CPU and a positive timeout", c.MemoryMiB, c.CPUs, c.Timeout)
	}
	for _, p := range []struct{ what, path string }{{"Kernel", c.Kernel}, {"Modules", c.Modules}, {"Work", c.Work}} {
		// The paths are written into the VM's shell scripts between single
		// quotes.
		if !filepath.IsAbs(p.path) || p.path != filepath.Clean(p.path) || strings.ContainsAny(p.path, "'\n\x00") {
			return c, fmt.Errorf("hostvm: %s %q: give a clean absolute path without quotes or newlines", p.what, p.path)
		}
	}
	if c.Work == "/" || strings.HasPrefix(c.Work+"/", HostRoot+"/") {
		return c, fmt.Errorf("hostvm: Work %s: give a directory of its own (not / or under %s)", c.Work, HostRoot)
	}
	if st, err := os.Stat(c.Work); err != nil || !st.IsDir() {
		return c, fmt.Errorf("hostvm: Work %s is not a directory: create it first", c.Work)
	}
	if _, err := os.Stat(c.Kernel); err != nil {
		return c, fmt.Errorf("hostvm: kernel: %w (make kernel fetches Debian's)", err)
	}
	if _, err := os.Stat(filepath.Join(c.Modules, "modules.dep")); err != nil {
		return c, fmt.Errorf("hostvm: the kernel's modules: %w (make kernel fetches Debian's)", err)
	}
	return c, checkStatic(c.Busybox)
}

// GuestPath is where the VM shows a host path: the same path, except
// under /tmp and /run (fresh in the VM), which are reached through
// HostRoot; Work and what is under it keep their path.
func (c Config) GuestPath(p string) string {
	p = filepath.Clean(p)
	if c.Work != "" && (p == c.Work || strings.HasPrefix(p, c.Work+"/")) {
		return p
	}
	for _, hidden := range []string{"/tmp", "/run"} {
		if p == hidden || strings.HasPrefix(p, hidden+"/") {
			return HostRoot + p
		}
	}
	return p
}

// stage1 is the initramfs's /init (busybox sh): it builds the VM's root
// from the host's and switch_roots into stage 2.
func stage1(work string) string {
	return `#!/bin/busybox sh
# hostvm stage 1: the host's root, read-only under an overlay in memory,
# becomes the VM's root; stage 2 runs there.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
fail() { echo "hostvm: stage 1: $*" >/dev/console; poweroff -f; }
while read -r m; do insmod "$m" || fail "insmod $m"; done </etc/oac/modules
mkdir -p /lower /upper /newroot
mount -t virtiofs -o ro hostroot /lower || fail "mount the host's root (virtio-fs tag hostroot)"
mount -t tmpfs -o mode=0755 tmpfs /upper || fail "tmpfs for the overlay"
mkdir -p /upper/upper /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/upper,workdir=/upper/work overlay /newroot || fail "overlay on the host's root"
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "tmpfs on /tmp"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "tmpfs on /run"
mkdir -p /newroot` + HostRoot + `
mount --move /lower /newroot` + HostRoot + ` || fail "move the host's root to ` + HostRoot + `"
cp /bin/busybox /hostvm/stage2.sh /hostvm/script.sh /newroot/run/hostvm/ || fail "copy the scripts"
mkdir -p '/newroot` + work + `' && mount -t virtiofs work '/newroot` + work + `' || fail "mount the work share at ` + work + `"
mount --move /dev /newroot/dev || fail "move /dev"
mount --move /proc /newroot/proc || fail "move /proc"
exec switch_root /newroot /bin/sh /run/hostvm/stage2.sh
`
}

// stage2 runs on the host's userspace (its /bin/sh): the kernel's
// filesystems, the modules, the script, its status, power off.
func stage2(modules string) string {
	return `# hostvm stage 2: the host's userspace under the VM's kernel.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
# busybox's poweroff -f powers off before it returns (sysrq's does not).
off() { sync; /run/hostvm/busybox poweroff -f; }
fail() { echo "hostvm: stage 2: $*" >/dev/console; off; }
mount -t sysfs sysfs /sys || fail "mount /sys"
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts || fail "mount /dev/pts"
mount -t tmpfs -o mode=1777 tmpfs /dev/shm || fail "mount /dev/shm"
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
mount -t securityfs securityfs /sys/kernel/security || fail "mount securityfs"
v=$(uname -r)
mkdir -p "/lib/modules/$v" && mount --bind '` + HostRoot + modules + `' "/lib/modules/$v" || fail "bind the kernel's modules"
ip link set lo up || fail "lo up"
hostname hostvm
# The output port is a serial line: no newline translation.
stty -F /dev/ttyS1 raw -echo || fail "the output port"
echo "hostvm: running the script" >/dev/console
cd / && /bin/sh /run/hostvm/script.sh </dev/null >/dev/ttyS1 2>&1
echo "` + exitMarker + `$?" >/dev/console
off
`
}

// qemuArgs is qemu's command line: no devices but the two serial ports
// and the two virtio-fs shares, memory shared with virtiofsd.
func qemuArgs(c Config, name, initrd, output string, sockets [2]string) []string {
	return []string{
		"-name", name,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot", // a panic or power-off ends qemu
		"-machine", "q35,memory-backend=mem",
		"-accel", "tcg",
		"-m", strconv.Itoa(c.MemoryMiB),
		"-smp", strconv.Itoa(c.CPUs),
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", c.MemoryMiB),
		"-kernel", c.Kernel,
		"-initrd", initrd,
		// mitigations=off: an emulated CPU does not speculate, and the
		// kernel's retpolines and barriers cost as much as a twofold
		// slowdown of exec-heavy scripts under TCG.
		"-append", "console=ttyS0 quiet panic=-1 mitigations=off",
		"-chardev", "stdio,id=con,signal=off",
		"-serial", "chardev:con",
		"-chardev", "file,id=out,path=" + output,
		"-serial", "chardev:out",
		"-chardev", "socket,id=fs0,path=" + sockets[0],
		"-device", "vhost-user-fs-pci,chardev=fs0,tag=hostroot",
		"-chardev", "socket,id=fs1,path=" + sockets[1],
		"-device", "vhost-user-fs-pci,chardev=fs1,tag=work",
	}
}

// scriptExit finds the script's exit status on the console.
func scriptExit(console []byte) (int, bool) {
	i := bytes.LastIndex(console, []byte(exitMarker))
	if i < 0 {
		return 0, false
	}
	line, _, _ := strings.Cut(string(console[i+len(exitMarker):]), "\n")
	n, err := strconv.Atoi(strings.TrimSpace(line))
	return n, err == nil
}

// Run boots the VM, runs cfg.Script and returns its status and output. An
// error means the script's status is unknown (the VM did not get that
// far, or ran out of time); the Result then holds what was seen.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	virtiofsd, err := findVirtiofsd(DefaultVirtiofsd)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hostvm-")
	if err != nil {
		return nil, fmt.Errorf("hostvm: %w", err)
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.img")
	if err := buildInitramfs(c, dir, initrd); err != nil {
		return nil, err
	}
	res := &Result{}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	var sockets [2]string
	for i, src := range []string{"/", c.Work} {
		sockets[i] = filepath.Join(dir, fmt.Sprintf("fs%d.sock", i))
		p, err := startVirtiofsd(virtiofsd, src, sockets[i])
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	output := filepath.Join(dir, "output")
	console := &tailBuffer{limit: ConsoleLimit}
	var consoleW io.Writer = console
	if c.Console != nil {
		consoleW = io.MultiWriter(console, c.Console)
	}
	qemuErr := &tailBuffer{limit: 16 << 10}
	cmd := exec.Command("qemu-system-x86_64", qemuArgs(c, filepath.Base(dir), initrd, output, sockets)...)
	cmd.Stdout, cmd.Stderr = consoleW, qemuErr
	cmd.Dir = "/"
	qemu, err := start(cmd)
	if err != nil {
		return nil, fmt.Errorf("hostvm: start qemu: %w", err)
	}
	// qemu first in Pids and stopped first: virtiofsd ends when it does.
	procs = append([]*proc{qemu}, procs...)
	for _, p := range procs {
		res.Pids = append(res.Pids, p.cmd.Process.Pid)
	}
	t0 := time.Now()
	timer := time.NewTimer(c.Timeout)
	defer timer.Stop()
	var ended error
	select {
	case <-qemu.done:
	case <-timer.C:
		ended = fmt.Errorf("the VM did not finish within %s", c.Timeout)
	case <-ctx.Done():
		ended = ctx.Err()
	}
	for _, p := range procs {
		p.stop()
	}
	res.Took = time.Since(t0)
	res.Console = console.Bytes()
	res.Output, _ = readTail(output, OutputLimit)
	if ended != nil {
		return res, fmt.Errorf("hostvm: %w (killed); the console's end:\n%s", ended, tailLines(res.Console, 20))
	}
	code, ok := scriptExit(res.Console)
	if !ok {
		return res, fmt.Errorf("hostvm: the VM stopped before the script's status (%s; qemu: %s); the console's end:\n%s",
			qemu.cmd.ProcessState, strings.TrimSpace(qemuErr.String()), tailLines(res.Console, 20))
	}
	res.Exit = code
	return res, nil
}

func buildInitramfs(c Config, dir, out string) error {
	files := map[string]string{
		"init.sh":   stage1(c.Work),
		"stage2.sh": stage2(c.Modules),
		"script.sh": c.Script,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o755); err != nil {
			return fmt.Errorf("hostvm: %w", err)
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("hostvm: %w", err)
	}
	defer f.Close()
	_, err = initramfs.Build(initramfs.Spec{
		Agent:      filepath.Join(dir, "init.sh"),
		ModulesDir: c.Modules,
		Modules:    bootModules,
		Files: []initramfs.File{
			{Src: c.Busybox, Dst: "/bin/busybox", Mode: 0o755},
			{Src: filepath.Join(dir, "stage2.sh"), Dst: "/hostvm/stage2.sh", Mode: 0o755},
			{Src: filepath.Join(dir, "script.sh"), Dst: "/hostvm/script.sh", Mode: 0o755},
		},
	}, f)
	if err != nil {
		return fmt.Errorf("hostvm: build the initramfs: %w", err)
	}
	return f.Close()
}

// startVirtiofsd serves src on a socket it gets already listening (fd 3),
// so qemu's connect cannot race its start.
func startVirtiofsd(bin, src, sock string) (*proc, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("hostvm: listen on %s: %w", sock, err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("hostvm: %w", err)
	}
	defer lf.Close()
	cmd := exec.Command(bin, "--fd=3", "-o", "source="+src, "-o", "cache=auto", "-o", "sandbox=chroot", "-o", "log_level=err")
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	log := &tailBuffer{limit: 16 << 10}
	cmd.Stdout, cmd.Stderr = log, log
	p, err := start(cmd)
	if err != nil {
		return nil, fmt.Errorf("hostvm: start virtiofsd for %s: %w", src, err)
	}
	return p, nil
}

// proc is a process Run started: in its own process group, killed with
// the caller's thread if that dies first.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

func start(cmd *exec.Cmd) (*proc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop kills the process by its pid (if it still runs) and waits for it.
func (p *proc) stop() {
	p.once.Do(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	mu    sync.Mutex
	limit int
	b     []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.limit; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.b...)
}

func (t *tailBuffer) String() string { return string(t.Bytes()) }

// readTail reads the last limit bytes of a file.
func readTail(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > limit {
		if _, err := f.Seek(st.Size()-limit, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// tailLines is the last n lines of b.
func tailLines(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), ConsoleLimit)
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), "\r"))
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
