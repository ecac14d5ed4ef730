// Package kit holds the pieces providers are built from, so that no
// provider imports another: the state root and where the shim's files
// are, binary lookup, the host-wide guest id slots, the default root (a
// read-only view of the host) and the guest's identity files, the guest
// paths the container providers share, the transport socket, the
// bounded console capture, and the record of the image a kept sandbox
// was created from (to tell a changed image at a later start).
//
// It owns only these shared pieces. It must not know any provider's
// settings, decide a provider's policy or speak the protocol.
package kit
