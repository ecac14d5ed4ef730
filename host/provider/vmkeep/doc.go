// Package vmkeep is what the VM providers (qemu, vz) keep of a kept
// sandbox (provider.Spec.Keep) in its directory: a copy of the image's
// root disk made when the sandbox is created (a reflink or clone where
// the filesystem shares blocks, else a plain copy), so the sandbox runs
// the image it was created from until reset even when the image file
// changes; a record of that image (path, size, time, SHA-256) to tell a
// changed image at the next start; and the kept disk, a sparse file with
// an ext4 filesystem made by mkfs.ext4, on which the guest keeps its
// writable layer (see protocol/vmparams.Keep). Discard removes them.
//
// It owns these files and nothing else in the directory. It runs only
// mkfs.ext4; it must not start the VM or speak the protocol.
package vmkeep
