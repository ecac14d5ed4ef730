// Command netprobe is the benchmarks' daemon inside a guest: it serves
// package probe's measurements on a loopback port. `netprobe emit N`
// writes N zero bytes to its standard output and `netprobe absorb N`
// reads N bytes from its standard input (what the kubernetes rows move
// through pods/exec alone, without oac, each way).
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/oac/sandbox-agent/bench/internal/probe"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "emit" {
		n, err := strconv.ParseInt(os.Args[2], 10, 64)
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "netprobe: emit wants a byte count")
			os.Exit(2)
		}
		chunk := make([]byte, 256<<10)
		for n > 0 {
			m, err := os.Stdout.Write(chunk[:min(int64(len(chunk)), n)])
			if err != nil {
				fmt.Fprintln(os.Stderr, "netprobe:", err)
				os.Exit(1)
			}
			n -= int64(m)
		}
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "absorb" {
		n, err := strconv.ParseInt(os.Args[2], 10, 64)
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "netprobe: absorb wants a byte count")
			os.Exit(2)
		}
		buf := make([]byte, 256<<10)
		for n > 0 {
			m, err := os.Stdin.Read(buf[:min(int64(len(buf)), n)])
			n -= int64(m)
			if err != nil && n > 0 {
				fmt.Fprintln(os.Stderr, "netprobe: absorb:", n, "bytes short:", err)
				os.Exit(1)
			}
		}
		return
	}
	if len(os.Args) != 3 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: netprobe serve ADDR | netprobe emit N | netprobe absorb N")
		os.Exit(2)
	}
	if err := probe.Serve(os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "netprobe:", err)
		os.Exit(1)
	}
}
