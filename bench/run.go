//go:build linux

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Options configure a run.
type Options struct {
	Bin, Out      string
	Runs, Density int
}

// Run measures every figure this host can and writes the report. A figure
// that needs something this host lacks is listed as not measured, with why.
func Run(o Options) error {
	r := NewReport()
	if err := MuxFigures(r, o.Runs); err != nil {
		return err
	}
	if err := EgressFigures(r, o.Runs, 256<<20, 200); err != nil {
		return err
	}
	b, err := FindBins(o.Bin)
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("bwrap"); err != nil || os.Geteuid() != 0 {
		r.Skip("bwrap figures", "need bubblewrap and root")
	} else {
		if err := BootFigures(r, b, o.Runs); err != nil {
			return err
		}
		if err := FootprintFigures(r, b, min(o.Runs, 5)); err != nil {
			return err
		}
		if err := DensityFigures(r, b, o.Density); err != nil {
			return err
		}
	}
	kernel, initrd := filepath.Join(o.Bin, "vmlinuz"), filepath.Join(o.Bin, "initramfs.img")
	_, errK := os.Stat(kernel)
	_, errI := os.Stat(initrd)
	if _, errQ := exec.LookPath("qemu-system-x86_64"); errQ != nil || errK != nil || errI != nil || os.Geteuid() != 0 {
		r.Skip("qemu boot figure", "needs qemu-system-x86_64, root and make initramfs (bin/vmlinuz, bin/initramfs.img)")
	} else if err := QemuFigures(r, b, kernel, initrd, min(o.Runs, 5)); err != nil {
		return err
	}
	if err := r.Write(o.Out); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	fmt.Printf("wrote %s/results.md and %s/results.json\n", o.Out, o.Out)
	return nil
}
