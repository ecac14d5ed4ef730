//go:build linux

// Command oac-guest is the agent baked into every guest image. See package
// guest/guestcli for how it starts, guest/agent for what it does and
// docs/cli.md for its command line.
package main

import (
	"os"

	"github.com/oac/sandbox-agent/guest/guestcli"
)

func main() { os.Exit(guestcli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
