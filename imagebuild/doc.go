// Package imagebuild builds guest images from a base rootfs (a directory,
// or a tar or tar.gz) for every platform: a directory for bwrap
// (--rootfs), a rootfs tar.gz for `wsl --import`, an OCI image layout for
// containers, an E2B template build context (a Dockerfile and that tar.gz),
// ext4 and erofs disk images plus a kernel and an initramfs for qemu and
// macOS.
//
// Every image gets the same fixed parts (Inject): oac-guest at
// /sbin/oac-guest, oac-sandbox-io at /usr/local/bin/oac-sandbox-io, the CA
// bundle, the runtime user and group 1000 (merged into the base's
// databases), /home/runtime (0700, 1000:1000), /environment/workspace,
// the runtimes' mount points and an /etc/wsl.conf that closes WSL's doors
// to the Windows host.
//
// Outputs are reproducible: the same inputs give bit-identical bytes.
// Entries are written in sorted order, owners are numeric only, every
// time is the build's epoch (SOURCE_DATE_EPOCH), gzip headers carry no
// name or time, filesystem UUIDs and hash seeds derive from the content,
// mke2fs runs with a pinned configuration and debugfs stamps the inode
// times mke2fs 1.47.0 takes from the build host. ReadOCILayout reads a
// layout back and checks every digest.
//
// It owns the image tree, the tar and OCI writers and readers, and the
// calls to mkfs.ext4, debugfs and mkfs.erofs. It must not download
// anything, run a guest, or write outside the output directory and its own
// temporary directory; materializing owners other than the caller's needs
// root.
package imagebuild
