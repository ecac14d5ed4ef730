//go:build windows

package imagecli

import "github.com/oac/sandbox-agent/internal/cli"

// buildImageCmd: package imagebuild writes Unix owners and device nodes,
// so it is not compiled for Windows; oac-image build says so (help.go).
func buildImageCmd(args []string, env cli.Env) int {
	return refuseBuild(args, env)
}
