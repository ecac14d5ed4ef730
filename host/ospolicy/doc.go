// Package ospolicy decides whether sandboxes may run on this operating
// system version: a hard block on macOS below 12 (Virtualization.framework's
// Linux boot loader, virtio sockets and the virtio-fs workspace share need
// it), and on Windows never a block but a warning on Windows 10 22H2 and a
// stronger one on older builds (no warning on Windows 11). Linux is ok.
//
// It owns the policy table (Evaluate, portable and unit-tested on every OS)
// and the detection of the running OS version (Detect, one file per OS).
// It must not know about providers: callers (oac-shim check and run) apply
// the verdict.
package ospolicy
