// Package transport turns endpoint URLs into byte streams: the one connection
// that carries a yamux session between oac-guest and oac-shim.
//
// Endpoints:
//
//	unix:///run/oac/agent.sock   AF_UNIX stream socket; dial and listen (every OS)
//	vsock://2:1024               AF_VSOCK CID and port; dial and listen (Linux only)
//	stdio://                     this process's stdin (read) and stdout (write); dial only
//	serial:///dev/vport1p1       a character device opened read-write, e.g. a
//	                             virtio-serial port; dial only (Linux only)
//
// It owns parsing, dialing and listening; OS-specific code lives in files
// named *_linux.go and *_other.go. It must not speak the protocol or know
// about sandboxes: it only hands out net.Conn and net.Listener values.
package transport
