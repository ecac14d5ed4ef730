//go:build windows

package imagecli

import "io"

// buildImageCmd: package imagebuild writes Unix owners and device nodes,
// so it is not compiled for Windows; oac-image build says so (help.go).
func buildImageCmd(args []string, stdout, stderr io.Writer) int {
	return refuseBuild(args, stdout, stderr)
}
