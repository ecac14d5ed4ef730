//go:build linux

package bench

import (
	"fmt"
	"os"
	"os/exec"
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
	if err := r.Write(o.Out); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	fmt.Printf("wrote %s/results.md and %s/results.json\n", o.Out, o.Out)
	return nil
}
