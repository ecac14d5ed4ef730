// Package e2e boots real guests: bubblewrap sandboxes, OCI containers (runc
// and crun), containers of a real Docker engine (the one that answers, or a
// private dockerd the run starts and stops: internal/dockerd) and qemu VMs
// started by the real oac-shim binary running the real oac-guest binary,
// built once per run by TestMain (VMs boot Debian's cloud kernel from the
// kernel cache, see make kernel, with an initramfs built by the real
// oac-image). Nothing here is faked but the misbehaving peers in
// internal/badguest, the stdio host used to test the guest alone, the
// in-test host that goes silent on a VM, and wsl.exe, which these machines do
// not have: internal/fakewsl imports the real image tarball and runs the real
// oac-guest inside it. internal/dockerrec records the docker client's argv
// and runs the real client; internal/vmdaemon is the daemon VM tests run,
// because the image has no shell.
//
// TestConformance is the table of every provider against every promise of
// the hosted contract (see conformance_test.go).
//
// The egress tests run the host's curl inside guests against servers on the
// host's 127.0.0.1 only, and give oac-shim a test /etc/hosts in a private
// mount namespace (unshare) so the broker resolves names without DNS.
//
// With CI=true no test skips: a missing dependency (bubblewrap, qemu, runc,
// crun, docker.io, iproute2, the kernel cache, root, curl, unshare) fails the run so a missing install step
// shows. Outside CI a test skips and says what to install.
package e2e
