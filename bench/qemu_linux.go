package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/initramfs"
)

// QemuFigures measures oac-shim booting a VM to ready against qemu booting
// the same kernel to a trivial init, under the accelerator qemu picks
// (software emulation here).
func QemuFigures(r *Report, b Bins, kernel, initrd string, runs int) error {
	dir, err := os.MkdirTemp("", "oac-bench-qemu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	initBin := filepath.Join(dir, "trivialinit")
	build := exec.Command("go", "build", "-trimpath", "-o", initBin, "./bench/internal/trivialinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build trivial init: %v: %s", err, out)
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
	bare := func() (float64, error) {
		cmd := exec.Command("qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1",
			"-nodefaults", "-nic", "none", "-no-reboot", "-display", "none", "-serial", "stdio",
			"-kernel", kernel, "-initrd", trivial, "-append", "console=ttyS0 panic=-1 quiet loglevel=3")
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
	shim := func() (float64, error) {
		cmd := exec.Command(b.Shim, "run", "--provider", "qemu", "--name", benchName(), "--kernel", kernel, "--initramfs", initrd, "--accel", "tcg")
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
	base, subj, err := Pair(runs, bare, shim)
	if err != nil {
		return fmt.Errorf("qemu boot: %w", err)
	}
	res := NewResult("qemu (TCG): oac-shim start to ready event", "ms", subj, "qemu booting the same kernel to a trivial init", base)
	res.Note = "software emulation"
	r.Add(res)
	return nil
}
