// Package privfile writes and reads the guest's private files, such as
// /home/runtime/sandbox-io-bootstrap.json, without ever following a
// symbolic link.
//
// The agent runs as root in the guest, and uid 1000 owns /home/runtime: it
// can plant a symlink there between boots to make root overwrite or disclose
// another file. So every path is walked from a trusted root one component at
// a time with directory file descriptors opened O_NOFOLLOW (no component is
// resolved through a symlink, so a planted link is refused and its target
// left untouched). Missing directories are created 0700 and handed to the
// owner. A file is written to a fresh name created O_CREAT|O_EXCL|O_NOFOLLOW
// with mode 0600, chowned, fsynced, renamed over the old one (a stale file
// from an earlier boot is replaced atomically) and the directory fsynced.
// Read opens a file a provider placed with the same rules and checks its
// type, owner, mode and size.
//
// It owns these file-system rules only. It must not decide what is written
// (package bootstrap validates content) and must not follow a path it did
// not walk itself.
package privfile
