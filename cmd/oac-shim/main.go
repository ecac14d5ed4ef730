// Command oac-shim boots a guest with a provider, sends it the bootstrap and
// reports its lifecycle as JSON events. See package host/shimcli and docs/cli.md.
package main

import (
	"os"

	"github.com/oac/sandbox-agent/host/shimcli"
)

func main() { os.Exit(shimcli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
