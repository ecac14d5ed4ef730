// Package shimcli is the command line of oac-shim: flag parsing, the
// provider registry, signal handling and exit codes. cmd/oac-shim only calls
// Main. It must not contain sandbox logic; that lives in package sandbox.
package shimcli
