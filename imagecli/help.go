package imagecli

import (
	"flag"
	"fmt"
	"io"
)

const buildHelp = `usage: oac-image build --agent PATH --sandbox-io PATH -o DIR [options]

Builds a guest image from a base rootfs and writes every requested output
into DIR (which must be new or empty), then DIR/SHA256SUMS (every file output and
every file of the OCI layout and of e2b/, for sha256sum -c):

  dir    DIR/rootfs/        a directory: oac-shim run --provider bwrap --rootfs DIR/rootfs
  tar    DIR/rootfs.tar.gz  for Windows: wsl --import NAME PATH DIR/rootfs.tar.gz
  oci    DIR/oci/           an OCI image layout (one gzip layer; tag from --ref)
  e2b    DIR/e2b/           an E2B template build context: e2b.Dockerfile and rootfs.tar.gz
         (the tar output's bytes); build it in DIR/e2b with e2b template build or
         docker build -f e2b.Dockerfile . (docs/hosted.md); not in the manifest
  ext4   DIR/disk.ext4      a raw ext4 disk (qemu, macOS); needs mkfs.ext4 and debugfs (e2fsprogs)
  erofs  DIR/disk.erofs     a raw erofs disk, lz4hc; needs mkfs.erofs (erofs-utils)
  vm     DIR/vmlinuz, DIR/initramfs.img   the kernel and an initramfs with oac-guest as
         /init and the modules a VM guest loads (virtio transports, disk, erofs,
         overlay, virtio-fs, nftables); needs --kernel and --kernel-modules
         (make kernel caches Debian's cloud kernel in .cache/kernel). The VM boots
         the initramfs, which mounts disk.ext4 or disk.erofs as its root

Every image gets /sbin/oac-guest, /usr/local/bin/oac-sandbox-io, the CA bundle at
/etc/ssl/certs/ca-certificates.crt, the user and group runtime (1000) with home
/home/runtime (0700) and /environment/workspace. The same inputs give
bit-identical outputs: every time is --epoch, owners are numeric, entries sorted,
filesystem UUIDs derive from the content. Writing owners (dir, ext4, erofs)
needs root.

Example (a base from a debootstrap directory, every output):
  sudo oac-image build --base /srv/bookworm --agent bin/oac-guest \
      --sandbox-io bin/oac-sandbox-io --kernel .cache/kernel/vmlinuz \
      --kernel-modules .cache/kernel/modules -o out/

options:
`

// buildElsewhere is why oac-image build is not on Windows (build_windows.go)
// and what to run there instead.
const buildElsewhere = `oac-image build runs on Linux and macOS build hosts only: its outputs carry
Unix owners, modes and device nodes, which Windows cannot write. On Windows,
stage a released image (oac-image stage --manifest FILE --platform windows)
and check it (oac-image manifest verify FILE --store DIR).
`

// refuseBuild is oac-image build where it cannot run: --help prints the
// command's help and why it is not here (exit 0), anything else says why
// and exits 1. It has no build tag so that it is tested on every host.
func refuseBuild(args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprint(stdout, buildHelp+"\n"+buildElsewhere)
			return 0
		}
	}
	fmt.Fprint(stderr, buildElsewhere)
	return 1
}

// wantsHelp prints help and the flags to stdout when args ask for it.
func wantsHelp(args []string, fs *flag.FlagSet, help string, stdout io.Writer) bool {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprint(stdout, help)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return true
		}
		if a == "--" {
			break
		}
	}
	return false
}
