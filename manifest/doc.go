// Package manifest owns the pinned manifest: one JSON document (schema
// version 1) that lists every artifact a host needs (guest images per
// platform and architecture, the kernel, the initramfs, the mirrored WSL
// installer), each with its URL, optional mirrors, exact size and sha256,
// so that the pins move together. The WSL installer may also say how it
// is run (its msiexec arguments) and whether Windows must restart after.
//
// It decodes strictly (at most 1 MiB; exactly the schema's keys at every
// level, each once, in their exact case, the optional ones ("mirrors",
// "install") bounded; no trailing data), validates every field, encodes,
// and checks files against their pins.
//
// It must not download anything (package stage does) and must not trust a
// manifest it has not validated. Error messages name the rule and the
// artifact and never echo a URL from the document.
package manifest
