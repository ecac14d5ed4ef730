// Package standin holds TEST FIXTURES: small programs that stand in for
// the real oac-sandbox-io and the real daemon, which do not exist in this
// repository. The e2e harness builds them and installs them in real bwrap
// guests (oac-shim run --sandbox-io, --install); `make demo` uses them too
// and says so. They check and print what the boot contract promises them
// (argv, environment, ids, session, no-new-privileges, the private file, the
// credentials) and never print a secret, only its SHA-256.
package standin
