// Package forward is oac-shim's ingress: the host's way to the daemon and
// other servers inside the guest. It owns the forward specs
// (LISTEN=GUESTPORT, LISTEN being a host loopback address 127.0.0.1:PORT or
// [::1]:PORT, or an absolute unix socket path made 0600), the listeners,
// the bound on concurrent forwarded connections, and the host-side URL of
// the daemon when a forward to its port exists.
//
// Each accepted connection is carried to the guest as one "forward"
// stream whose header names only the guest port: the guest dials
// 127.0.0.1:PORT and nothing else. Forwards outlive guest sessions (a
// restarted sandbox gets the same listeners); while no guest is attached
// a connection is closed at once.
//
// It must not listen on anything but loopback or a unix socket, open a
// stream to a guest that did not offer forwards, copy payload bytes into
// logs or events, or decide anything about the sandbox's lifecycle.
package forward
