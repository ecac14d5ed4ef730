package vmguest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/initramfs"
	"github.com/oac/sandbox-agent/protocol/vmparams"
)

// Architectures a VM guest can be.
const (
	ArchAMD64 = initramfs.ArchAMD64
	ArchARM64 = initramfs.ArchARM64
)

// KernelArch tells an x86 bzImage (amd64) from an arm64 Image; see
// initramfs.KernelArch.
func KernelArch(path string) (string, error) { return initramfs.KernelArch(path) }

// Share tags and guest paths. The workspace is the contract's; volumes
// replace a runtime directory.
const (
	WorkspaceTag  = "workspace"
	WorkspacePath = "/environment/workspace"
)

// Share is one host directory a VM guest mounts over virtio-fs.
type Share struct {
	Tag       string
	HostPath  string
	GuestPath string
	ReadOnly  bool
}

// Shares returns the VM's shares: the workspace (a host directory, may be
// empty) at WorkspacePath and each volume (guest directory -> host
// directory, see provider.VolumeDirs) at its directory, tagged with the
// directory's name. Every host path must be a directory; errors wrap
// provider.ErrInvalidSpec. The result is sorted by guest path.
func Shares(workspace string, readOnly bool, volumes map[string]string) ([]Share, error) {
	var out []Share
	if workspace != "" {
		out = append(out, Share{Tag: WorkspaceTag, HostPath: workspace, GuestPath: WorkspacePath, ReadOnly: readOnly})
	}
	for dir, host := range volumes {
		tag := filepath.Base(dir)
		out = append(out, Share{Tag: tag, HostPath: host, GuestPath: dir})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GuestPath < out[j].GuestPath })
	for _, s := range out {
		what := "shared directory"
		if s.Tag != WorkspaceTag {
			what = "volume " + s.GuestPath
		}
		if !filepath.IsAbs(s.HostPath) {
			return nil, fmt.Errorf("%w: %s: %s is not an absolute path", provider.ErrInvalidSpec, what, s.HostPath)
		}
		st, err := os.Stat(s.HostPath)
		if err != nil || !st.IsDir() {
			return nil, fmt.Errorf("%w: %s: %s is not a directory", provider.ErrInvalidSpec, what, s.HostPath)
		}
	}
	if _, err := vmparams.FormatShares(guestShares(out)); err != nil {
		return nil, fmt.Errorf("%w: %w", provider.ErrInvalidSpec, err)
	}
	return out, nil
}

func guestShares(shares []Share) []vmparams.Share {
	out := make([]vmparams.Share, len(shares))
	for i, s := range shares {
		out[i] = vmparams.Share{Tag: s.Tag, Path: s.GuestPath, ReadOnly: s.ReadOnly}
	}
	return out
}

// KernelParams returns the oac.* parameters for a guest that boots from
// its root disk (root), keeps its writes on a kept disk (kept: a kept
// sandbox, see vmparams.Keep; attached after the root disk) and mounts
// shares.
func KernelParams(root, kept bool, shares []Share) []string {
	var out []string
	if root {
		out = append(out, vmparams.Root+"="+vmparams.RootDevice)
	}
	if kept {
		out = append(out, vmparams.Keep+"="+vmparams.KeepDevice(root))
	}
	if len(shares) > 0 {
		v, _ := vmparams.FormatShares(guestShares(shares)) // checked by Shares
		out = append(out, vmparams.Shares+"="+v)
	}
	return out
}

// InstallDir is where installed binaries appear in the guest (the guest
// lays them over the root disk's, see guest/vminit).
const InstallDir = "/usr/local/bin"

// InstallFiles returns the initramfs overlay files for installs (name ->
// host binary), each a readable regular file; errors wrap
// provider.ErrInvalidSpec.
func InstallFiles(installs map[string]string) ([]initramfs.File, error) {
	names := make([]string, 0, len(installs))
	for n := range installs {
		names = append(names, n)
	}
	sort.Strings(names)
	var files []initramfs.File
	for _, n := range names {
		src := installs[n]
		st, err := os.Stat(src)
		if err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: install %s: %s is not a readable file", provider.ErrInvalidSpec, n, src)
		}
		files = append(files, initramfs.File{Src: src, Dst: InstallDir + "/" + n, Mode: 0o755})
	}
	return files, nil
}

// ComposeInitramfs writes base followed by an archive of the installs to
// out (see initramfs.ComposeOverlay); with no installs it does nothing
// and returns base.
func ComposeInitramfs(base, out string, installs map[string]string) (string, error) {
	if len(installs) == 0 {
		return base, nil
	}
	files, err := InstallFiles(installs)
	if err != nil {
		return "", err
	}
	if err := initramfs.ComposeOverlay(base, out, files); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: %w", provider.ErrInvalidSpec, err)
		}
		return "", err
	}
	return out, nil
}
