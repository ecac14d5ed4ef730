// Command oac-image builds guest images. See package initramfs and
// README.md.
package main

import (
	"os"

	"github.com/oac/sandbox-agent/initramfs/imagecli"
)

func main() { os.Exit(imagecli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
