// Command oac-image builds guest images. See package imagecli and
// docs/images.md.
package main

import (
	"os"

	"github.com/oac/sandbox-agent/imagecli"
)

func main() { os.Exit(imagecli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
