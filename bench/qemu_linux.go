package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/initramfs"
)

// VMArch is one guest architecture the qemu figures boot.
type VMArch struct {
	Arch string
	// KernelCache is a make kernel cache (vmlinuz, modules/).
	KernelCache string
}

// qemuArchArgs are the machine arguments the qemu provider uses for arch
// under software emulation, and the kernel's console (with the provider's
// other per-architecture parameter).
func qemuArchArgs(arch string) (bin string, args []string, console string) {
	if arch == initramfs.ArchARM64 {
		args = []string{"-machine", "virt", "-cpu", "cortex-a72"}
		if _, err := os.Stat("/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"); err == nil {
			args = append(args, "-bios", "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd")
		}
		return "qemu-system-aarch64", args, "ttyAMA0"
	}
	return "qemu-system-x86_64", []string{"-machine", "q35"}, "ttyS0 no_timer_check"
}

// crossBuild builds a Go package for linux/arch, static.
func crossBuild(pkg, out, arch string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s for %s: %v: %s", pkg, arch, err, b)
	}
	return nil
}

// QemuFigures measures oac-shim booting a VM to ready, from its initramfs
// alone and from the image's root disk (erofs), for each architecture,
// each against qemu booting the same kernel to a trivial init, under
// software emulation (TCG).
func QemuFigures(r *Report, b Bins, arches []VMArch, runs int) error {
	dir, err := os.MkdirTemp("", "oac-bench-qemu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, a := range arches {
		bin, machine, console := qemuArchArgs(a.Arch)
		label := fmt.Sprintf("qemu %s (TCG)", a.Arch)
		if _, err := exec.LookPath(bin); err != nil {
			r.Skip(label+" boot figures", "needs "+bin)
			continue
		}
		if _, err := os.Stat(filepath.Join(a.KernelCache, "modules", "modules.dep")); err != nil {
			r.Skip(label+" boot figures", "needs the kernel cache "+a.KernelCache+" (make kernels)")
			continue
		}
		if err := qemuArchFigures(r, b, a, filepath.Join(dir, a.Arch), bin, machine, console, label, runs); err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	}
	return nil
}

// vmImage builds the image every guest boots into img: its initramfs (the
// default modules) and its root disk (erofs), and returns the kernel,
// initramfs and disk paths. Nothing runs oac-sandbox-io here (no
// bootstrap): the agent stands in for it.
func vmImage(guest string, a VMArch, img string) (kernel, initrd, disk string, err error) {
	if _, err := imagebuild.Build(imagebuild.Spec{
		Injection: imagebuild.Injection{Agent: guest, SandboxIO: guest}, Arch: a.Arch,
		Outputs: []string{imagebuild.OutErofs, imagebuild.OutVM}, Out: img,
		Kernel: filepath.Join(a.KernelCache, "vmlinuz"), ModulesDir: filepath.Join(a.KernelCache, "modules"),
	}); err != nil {
		return "", "", "", fmt.Errorf("image: %w", err)
	}
	return filepath.Join(img, imagebuild.KernelName), filepath.Join(img, imagebuild.InitramfsName), filepath.Join(img, imagebuild.ErofsName), nil
}

func qemuArchFigures(r *Report, b Bins, a VMArch, dir, bin string, machine []string, console, label string, runs int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	guest := b.Guest
	if a.Arch != runtime.GOARCH {
		guest = filepath.Join(dir, "oac-guest")
		if err := crossBuild("./cmd/oac-guest", guest, a.Arch); err != nil {
			return err
		}
	}
	initBin := filepath.Join(dir, "trivialinit")
	if err := crossBuild("./bench/internal/trivialinit", initBin, a.Arch); err != nil {
		return err
	}
	trivial := filepath.Join(dir, "trivial.img")
	f, err := os.Create(trivial)
	if err != nil {
		return err
	}
	_, err = initramfs.Build(initramfs.Spec{Agent: initBin}, f)
	f.Close()
	if err != nil {
		return fmt.Errorf("trivial initramfs: %w", err)
	}
	kernel, initrd, disk, err := vmImage(guest, a, filepath.Join(dir, "image"))
	if err != nil {
		return err
	}
	bare := func() (float64, error) {
		args := append(append([]string{}, machine...), "-accel", "tcg", "-m", "256", "-smp", "1",
			"-nodefaults", "-nic", "none", "-no-reboot", "-display", "none", "-serial", "stdio",
			"-kernel", kernel, "-initrd", trivial, "-append", "console="+console+" panic=-1 quiet loglevel=3")
		cmd := exec.Command(bin, args...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		t := time.Now()
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "trivial init ran") {
				return ms(time.Since(t)), nil
			}
		}
		return 0, fmt.Errorf("trivial init never ran")
	}
	shim := func(extra ...string) func() (float64, error) {
		return func() (float64, error) {
			args := append([]string{"run", "--provider", "qemu", "--name", benchName(), "--kernel", kernel, "--initramfs", initrd,
				"--accel", "tcg", "--boot-timeout", "120s"}, extra...)
			cmd := exec.Command(b.Shim, args...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				return 0, err
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			t := time.Now()
			if err := cmd.Start(); err != nil {
				return 0, err
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"state":"ready"`) {
					d := ms(time.Since(t))
					_ = cmd.Process.Signal(os.Interrupt)
					go func() {
						for sc.Scan() {
						}
					}()
					_ = cmd.Wait()
					return d, nil
				}
			}
			_ = cmd.Wait()
			return 0, fmt.Errorf("%w: %s", errNoReady, strings.TrimSpace(stderr.String()))
		}
	}
	for _, row := range []struct {
		what  string
		extra []string
	}{
		{"initramfs only", nil},
		{"from the image's root disk (erofs)", []string{"--disk", disk}},
	} {
		base, subj, err := Pair(runs, bare, shim(row.extra...))
		if err != nil {
			return fmt.Errorf("boot %s: %w", row.what, err)
		}
		res := NewResult(label+": oac-shim start to ready event, "+row.what, "ms", subj, "qemu booting the same kernel to a trivial init", base)
		res.Note = "software emulation"
		r.Add(res)
	}
	return nil
}
