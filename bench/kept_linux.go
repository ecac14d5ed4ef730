package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/internal/dockerd"
)

// keptBench runs kept sandboxes of one provider under a keep root of its
// own: the first create and start of one, and the second start of
// another that has run once.
type keptBench struct {
	b    Bins
	root string
	// prov are create's flags (the provider and its own), startArgs
	// start's extra ones; timeout bounds one start to ready.
	prov, startArgs []string
	timeout         time.Duration
	// ran are sandboxes started once, for a second start.
	ran []string
}

func (k *keptBench) shim(args ...string) error {
	out, err := exec.Command(k.b.Shim, append(args, "--keep-root", k.root)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("oac-shim %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// start runs oac-shim start on name to ready and stops it.
func (k *keptBench) start(name string) (time.Duration, error) {
	s, err := startCommand(k.b, k.timeout, "start", name, append([]string{"--keep-root", k.root}, k.startArgs...)...)
	if err != nil {
		return 0, err
	}
	d := s.ready
	if err := s.stop(); err != nil {
		return 0, fmt.Errorf("stop: %w", err)
	}
	return d, nil
}

// first creates a sandbox and starts it to ready: the time of both.
func (k *keptBench) first() (float64, error) {
	name := benchName()
	t := time.Now()
	if err := k.shim(append([]string{"create", "--name", name, "--agent", k.b.Guest}, k.prov...)...); err != nil {
		return 0, err
	}
	created := time.Since(t)
	d, err := k.start(name)
	if err != nil {
		return 0, err
	}
	k.ran = append(k.ran, name)
	return ms(created + d), nil
}

// second starts a sandbox that ran once to ready (made untimed when
// none is waiting), then destroys it.
func (k *keptBench) second() (float64, error) {
	if len(k.ran) == 0 {
		if _, err := k.first(); err != nil {
			return 0, err
		}
	}
	name := k.ran[0]
	k.ran = k.ran[1:]
	d, err := k.start(name)
	if err != nil {
		return 0, err
	}
	if err := k.shim("destroy", "--name", name); err != nil {
		return 0, err
	}
	return ms(d), nil
}

// keptRow is one provider the kept figures measure.
type keptRow struct {
	// create are create's flags, start start's extra ones.
	create, start []string
	runs          int
	timeout       time.Duration
	// label names the row (default: create's flags after --provider);
	// note is the figure's note.
	label, note string
}

// KeptFigures measures, per provider that keeps here (bwrap, oci with
// runc and crun, docker on a Docker engine this run starts when none
// answers, qemu amd64 under software emulation from the image's root
// disk, built with the kernel cache of vm), the second start of a kept
// sandbox to ready beside its first create and start. The qemu row runs
// at most 5 times: each boot takes seconds.
func KeptFigures(r *Report, b Bins, runs int, vm VMArch) error {
	rows := []keptRow{{create: []string{"--provider", "bwrap"}, runs: runs, timeout: 60 * time.Second}}
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.Skip("kept sandbox figure with oci "+rt, rt+" is not installed")
			continue
		}
		rows = append(rows, keptRow{create: []string{"--provider", "oci", "--runtime", rt}, runs: runs, timeout: 60 * time.Second})
	}
	for _, row := range rows {
		if err := keptFigure(r, b, row); err != nil {
			return err
		}
	}
	if err := keptDocker(r, b, runs); err != nil {
		return err
	}
	return keptQemu(r, b, min(runs, 5), vm)
}

// keptDocker is the docker row, on an image of /bin/true and the agent.
func keptDocker(r *Report, b Bins, runs int) error {
	const what = "kept sandbox figure with docker"
	if missing := dockerd.Missing(); missing != "" {
		r.Skip(what, missing)
		return nil
	}
	dir, cleanup, err := sharedTempDir("oac-bench-kept-docker-")
	if err != nil {
		return err
	}
	defer cleanup()
	_, ref, done, err := dockerBench(context.Background(), b, dir, nil)
	if err != nil {
		var nd noDocker
		if errors.As(err, &nd) {
			r.Skip(what, err.Error())
			return nil
		}
		return fmt.Errorf("kept docker: %w", err)
	}
	defer done()
	return keptFigure(r, b, keptRow{create: []string{"--provider", "docker", "--docker-image", ref}, runs: runs, timeout: 60 * time.Second, label: "docker"})
}

// keptQemu is the qemu amd64 row: TCG, from the image's root disk.
func keptQemu(r *Report, b Bins, runs int, vm VMArch) error {
	const what = "kept sandbox figure with qemu amd64 (TCG)"
	bin, _, _ := qemuArchArgs(vm.Arch)
	if _, err := exec.LookPath(bin); err != nil {
		r.Skip(what, "needs "+bin)
		return nil
	}
	if _, err := os.Stat(filepath.Join(vm.KernelCache, "modules", "modules.dep")); err != nil {
		r.Skip(what, "needs the kernel cache "+vm.KernelCache+" (make kernels)")
		return nil
	}
	dir, cleanup, err := sharedTempDir("oac-bench-kept-qemu-")
	if err != nil {
		return err
	}
	defer cleanup()
	guest := b.Guest
	if vm.Arch != runtime.GOARCH {
		guest = filepath.Join(dir, "oac-guest")
		if err := crossBuild("./cmd/oac-guest", guest, vm.Arch); err != nil {
			return err
		}
	}
	kernel, initrd, disk, err := vmImage(guest, vm, filepath.Join(dir, "image"))
	if err != nil {
		return fmt.Errorf("kept qemu: %w", err)
	}
	return keptFigure(r, b, keptRow{
		create: []string{"--provider", "qemu", "--kernel", kernel, "--initramfs", initrd, "--disk", disk, "--accel", "tcg"},
		start:  []string{"--boot-timeout", "120s"}, runs: runs, timeout: 150 * time.Second,
		label: "qemu amd64, from the image's root disk", note: "software emulation",
	})
}

// keptFigure measures one row under a keep root of its own and adds it.
func keptFigure(r *Report, b Bins, row keptRow) error {
	root, err := os.MkdirTemp("", "oac-bench-keep-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o711); err != nil {
		return err
	}
	k := &keptBench{b: b, root: root, prov: row.create, startArgs: row.start, timeout: row.timeout}
	base, subj, err := Pair(row.runs, k.first, k.second)
	for _, n := range k.ran {
		_ = k.shim("destroy", "--name", n)
	}
	what := row.label
	if what == "" {
		what = strings.Join(row.create[1:], " ")
	}
	if err != nil {
		return fmt.Errorf("kept %s: %w", what, err)
	}
	res := NewResult(what+": second start of a kept sandbox to ready", "ms", subj, "its oac-shim create and first start to ready", base)
	res.Note = row.note
	r.Add(res.Judge("≤ 1x its first create and start", res.Ratio <= 1))
	return nil
}
