// Package initramfs builds the initramfs a VM guest boots from: a newc cpio
// archive, gzip-compressed, that the Linux kernel unpacks into its root
// filesystem before it runs /init.
//
// It owns the archive format (a small deterministic newc writer and a
// bounded reader for tests and inspection), the image layout (oac-guest as
// /init, /dev/console, a 0755 root, /etc/passwd and /etc/group with the
// runtime user 1000 whose home is /home/runtime, extra files) and kernel
// modules: picked by name, dependencies resolved from modules.dep, .ko.xz,
// .ko.zst and .ko.gz decompressed, listed in load order in
// /etc/oac/modules for the guest to finit_module at boot.
//
// Same inputs give the same bytes: members are sorted, mtimes, inode and
// device numbers are fixed, and the gzip header has no name and no time.
//
// It must not run on the guest (oac-guest does not import it), download
// anything, or read beyond the files it is given; soft dependencies
// (modules.softdep) are not followed: name such modules explicitly.
package initramfs
