//go:build linux

// Command oac-bench runs the benchmarks of package bench and writes
// bench/results.md and bench/results.json. `make bench` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/oac/sandbox-agent/bench"
)

func main() {
	bin := flag.String("bin", "bin", "directory with oac-shim and oac-guest")
	out := flag.String("out", "bench", "directory for results.md and results.json")
	runs := flag.Int("runs", 15, "repetitions of each figure")
	density := flag.Int("density", 50, "sandboxes started at once for the density figure")
	only := flag.String("only", "", "comma-separated groups to run (mux, egress, transparent, clients, boot, footprint, density, oci, hosted, qemu, kept, kubernetes, peer); prints, writes nothing")
	merge := flag.Bool("merge", false, "with -only kubernetes or peer: replace those groups' rows in -out's results.md and results.json, keep the others")
	flag.Parse()
	o := bench.Options{Bin: *bin, Out: *out, Runs: *runs, Density: *density, Merge: *merge}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	if err := bench.Run(o); err != nil {
		fmt.Fprintln(os.Stderr, "oac-bench:", err)
		os.Exit(1)
	}
}
