//go:build linux

// Command oac-bench runs the benchmarks of package bench and writes
// bench/results.md and bench/results.json. `make bench` runs it.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/oac/sandbox-agent/bench"
	"github.com/oac/sandbox-agent/internal/cli"
)

func main() {
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version") {
		cli.PrintVersion(os.Stdout, "oac-bench", false)
		return
	}
	fs := cli.FlagSet("oac-bench")
	bin := fs.String("bin", "bin", "directory with oac-shim and oac-guest")
	out := fs.String("out", "bench", "directory for results.md and results.json")
	runs := fs.Int("runs", 15, "repetitions of each figure")
	density := fs.Int("density", 50, "sandboxes started at once for the density figure")
	only := fs.String("only", "", "comma-separated groups to run (mux, egress, transparent, clients, boot, footprint, density, oci, hosted, qemu, kept, kubernetes, peer, warm); prints, writes nothing")
	merge := fs.Bool("merge", false, "with -only kubernetes, peer or warm: replace those groups' rows in -out's results.md and results.json, keep the others")
	if args, code, ok := cli.Parse(fs, os.Args[1:], env); !ok || len(args) > 0 {
		if ok {
			code = cli.Usagef(fs, os.Stderr, "takes no arguments, not %q", args)
		}
		os.Exit(code)
	}
	o := bench.Options{Bin: *bin, Out: *out, Runs: *runs, Density: *density, Merge: *merge}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	if err := bench.Run(o); err != nil {
		fmt.Fprintln(os.Stderr, "oac-bench:", err)
		os.Exit(1)
	}
}
