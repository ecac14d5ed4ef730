// Command netprobe is the benchmarks' daemon inside a guest: it serves
// package probe's measurements on a loopback port.
package main

import (
	"fmt"
	"os"

	"github.com/oac/sandbox-agent/bench/internal/probe"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: netprobe serve ADDR")
		os.Exit(2)
	}
	if err := probe.Serve(os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "netprobe:", err)
		os.Exit(1)
	}
}
