//go:build !windows

package imagecli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/initramfs"
	"github.com/oac/sandbox-agent/manifest"
)

// buildImageCmd is oac-image build (on Windows: build_windows.go).
func buildImageCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oac-image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, buildHelp); fs.PrintDefaults() }
	base := fs.String("base", "", "base rootfs: a directory, or a .tar or .tar.gz (default: empty, the injected parts only)")
	agent := fs.String("agent", "", "static oac-guest binary, becomes /sbin/oac-guest (required)")
	sio := fs.String("sandbox-io", "", "oac-sandbox-io binary, becomes /usr/local/bin/oac-sandbox-io (required)")
	ca := fs.String("ca-bundle", imagebuild.DefaultCABundle, "PEM CA bundle for /etc/ssl/certs/ca-certificates.crt")
	var files fileFlag
	fs.Var(&files, "file", "extra file SRC:DST[:MODE] for the image (repeatable)")
	allRoot := fs.Bool("all-root", false, "make every base entry owned by 0:0 (a base unpacked by a non-root user)")
	defEpoch := int64(0)
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			defEpoch = n
		}
	}
	epoch := fs.Int64("epoch", defEpoch, "every timestamp in the outputs, in seconds since 1970 (default: $SOURCE_DATE_EPOCH, else 0)")
	arch := fs.String("arch", "", "image architecture: amd64 or arm64 (default: this host's)")
	var outputs listFlag
	fs.Var(&outputs, "output", "outputs to build: "+strings.Join(imagebuild.AllOutputs, ",")+" (repeatable or comma-separated; default all)")
	kernel := fs.String("kernel", "", "vm: kernel image to ship as vmlinuz (e.g. .cache/kernel/vmlinuz)")
	modDir := fs.String("kernel-modules", "", "vm: the kernel's modules directory with modules.dep (e.g. .cache/kernel/modules)")
	var modules listFlag
	fs.Var(&modules, "module", "vm: initramfs module (default "+strings.Join(initramfs.DefaultModules, ",")+")")
	var irdFiles fileFlag
	fs.Var(&irdFiles, "initramfs-file", "vm: extra file SRC:DST[:MODE] for the initramfs (repeatable)")
	ref := fs.String("ref", "latest", "oci: the image's tag (org.opencontainers.image.ref.name)")
	baseURL := fs.String("base-url", "", "write DIR/manifest.json pinning the file outputs (not oci/ or e2b/) at URL/NAME (https)")
	release := fs.String("release", "", "the manifest's release name (required with --base-url)")
	wslInstaller := fs.String("wsl-installer", "", "the mirrored WSL installer (MSI): copied into DIR, listed in SHA256SUMS and pinned in the manifest (kind wsl-installer) for the WSL provider")
	var mirrorURLs urlsFlag
	fs.Var(&mirrorURLs, "mirror-url", "with --base-url: another base URL serving the same files, listed as each artifact's mirror URL/NAME (repeatable, tried in order)")
	wslArgs := fs.String("wsl-installer-args", "", "with --wsl-installer: the arguments after msiexec.exe /i FILE, space-separated (e.g. \"/passive /norestart\"); pinned with the installer")
	wslRestart := fs.Bool("wsl-installer-restart", true, "with --wsl-installer: whether Windows must restart after installing (pinned with the installer when this or --wsl-installer-args is given)")
	out := fs.String("o", "", "output directory, new or empty (required)")
	if wantsHelp(args, fs, buildHelp, stdout) {
		return 0
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *agent == "" || *sio == "" || *out == "" {
		fmt.Fprintln(stderr, "oac-image build: --agent, --sandbox-io and -o are required and no other arguments are taken (see oac-image build --help)")
		return 2
	}
	var extra []imagebuild.ExtraFile
	for _, f := range files {
		extra = append(extra, imagebuild.ExtraFile{Src: f.Src, Dst: f.Dst, Mode: f.Mode})
	}
	var plan *manifest.Install
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "wsl-installer-args" || f.Name == "wsl-installer-restart" {
			plan = &manifest.Install{Args: strings.Fields(*wslArgs), Restart: *wslRestart}
		}
	})
	spec := imagebuild.Spec{
		Base:      *base,
		Injection: imagebuild.Injection{Agent: *agent, SandboxIO: *sio, CABundle: *ca, Files: extra, AllRoot: *allRoot},
		Epoch:     *epoch, Arch: *arch, Outputs: outputs, Out: *out,
		Kernel: *kernel, ModulesDir: *modDir, Modules: modules, InitramfsFiles: irdFiles,
		Ref: *ref, BaseURL: *baseURL, Release: *release, WSLInstaller: *wslInstaller, Log: stderr,
		MirrorURLs: mirrorURLs, WSLInstall: plan,
	}
	start := time.Now()
	res, err := imagebuild.Build(spec)
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: build: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "oac-image: built %d outputs of %d entries in %s (tree sha256 %s)\n", len(res.Outputs), res.Entries, time.Since(start).Round(time.Millisecond), res.TreeDigest[:16])
	for _, o := range res.Outputs {
		fmt.Fprintf(stdout, "%s  %s\n", o.SHA256, o.Path)
	}
	return 0
}
