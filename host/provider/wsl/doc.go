// Package wsl is the Windows provider: each sandbox is a WSL2 distribution
// of its own, imported from a root filesystem tarball (the image build's
// output) with `wsl.exe --import oac-NAME DIR ROOTFS.tar.gz --version 2`,
// its agent started as `wsl.exe -d oac-NAME -u root --exec /sbin/oac-guest
// --transport stdio://` so the yamux session runs over wsl.exe's stdin and
// stdout (transport.StreamConn). Stop terminates the distribution
// (--terminate), Destroy unregisters it (--unregister, which deletes its
// disk), Reset is unregister plus import. Check runs `wsl.exe --version`
// first and, when WSL is missing or too old, names the mirrored installer
// pinned in the manifest: where it is staged in the store (verified
// first: a damaged file is never offered), the command line that runs it
// (msiexec.exe /i and the manifest's arguments) and whether Windows must
// restart after; or, not staged yet, how to stage it.
//
// Command assembly, output decoding (wsl.exe writes UTF-16LE) and error
// mapping are portable and unit-tested on every OS; wsl.exe is reached
// only through the Runner interface, so Linux tests run a fake wsl.exe.
//
// It owns the wsl.exe command lines and the distributions it creates
// (named oac-NAME, never any other). It must not speak the protocol
// (package sandbox does), build the tarball, download the installer
// (package stage does) or run it (the user or the app does).
package wsl
