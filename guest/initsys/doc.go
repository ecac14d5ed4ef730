// Package initsys performs the init duties of oac-guest when it runs as PID 1
// of a sandbox: mounting the pseudo filesystems that are missing, bringing
// the loopback interface up and setting the hostname.
//
// Every step is idempotent and checks before it acts, because providers
// differ in what they already set up (bubblewrap mounts /proc and /dev, a VM
// kernel mounts nothing). It must not start processes or speak the protocol.
package initsys
