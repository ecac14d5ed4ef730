// Package transport turns endpoint URLs into byte streams: the one connection
// that carries a yamux session between oac-guest and oac-shim.
//
// Endpoints:
//
//	unix:///run/oac/agent.sock   AF_UNIX stream socket (every OS)
//	vsock://2:1024               AF_VSOCK CID and port (Linux only)
//	stdio://                     this process's stdin (read) and stdout (write)
//	serial:///dev/vport1p1       a character device opened read-write, e.g. a
//	                             virtio-serial port (Linux only)
//	unix+listen:///run/oac/session.sock
//	                             the guest listens instead, takes one
//	                             connection and removes the socket (a Pod's
//	                             agent, reached by a bridge the host execs:
//	                             `oac-guest bridge unix:///run/oac/session.sock`
//	                             relays its stdin and stdout with Relay)
//
// The guest dials (it connects first), except on unix+listen. The host's side of each
// transport belongs to the provider that sets it up: an owner-only unix
// socket (package internal/sockfile), a vsock listener of the VM, the pipes
// of a runtime process.
//
// It owns parsing and dialing; OS-specific code lives in files named
// *_linux.go and *_other.go. It must not speak the protocol or know about
// sandboxes: it only hands out net.Conn values.
package transport
