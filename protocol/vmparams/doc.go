// Package vmparams is the contract between a VM provider and the guest's
// PID 1 on the kernel command line: the names of the oac.* parameters,
// their formats and limits. The host side (the qemu and vz providers)
// writes them with the Format functions; guest/vminit parses the command
// line and the values with the Parse functions.
//
// It owns nothing but these names and formats. It must not read the
// command line, touch the filesystem or depend on host or guest code.
package vmparams
