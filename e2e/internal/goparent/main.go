// Command goparent is a Go parent of one sandbox that outlives it: it
// starts the sandbox with package client (Options.Outlive), waits until
// it is ready, prints one line and then waits to be killed. The e2e tests
// kill it with SIGKILL and attach to the sandbox from another process.
//
//	goparent -shim OAC_SHIM -name NAME -bootstrap FILE -- RUN FLAGS...
//
// The line is "ready SEQ URL USERNAME PASSWORD": the ready event's seq and
// what reaches the daemon (a test's password, printed only here).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oac/sandbox-agent/client"
)

func main() {
	shim := flag.String("shim", "oac-shim", "the oac-shim binary")
	name := flag.String("name", "", "sandbox name")
	boot := flag.String("bootstrap", "", "the bootstrap JSON file")
	flag.Parse()
	bf, err := os.Open(*boot)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goparent:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, ready, err := client.StartReady(ctx, client.Options{Shim: *shim, Name: *name, Bootstrap: bf, Outlive: true,
		Forwards: []string{"127.0.0.1:0=4096"}, Stderr: os.Stderr, Args: flag.Args()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "goparent:", err)
		os.Exit(1)
	}
	fmt.Printf("ready %d %s %s %s\n", ready.Seq, ready.URL, ready.Username, s.Password())
	select {} // until killed
}
