//go:build linux

// Command fakewsl stands in for wsl.exe in the WSL provider's end-to-end
// tests on Linux. It honours the argv the provider uses and keeps its
// "distributions" in $OAC_FAKE_WSL_STATE:
//
//	--version                      prints a WSL version (UTF-16LE unless WSL_UTF8=1)
//	--list --quiet                 lists imported distributions
//	--import NAME DIR TAR --version 2
//	                               unpacks the gzip'd tarball (owners, modes and
//	                               symlinks kept) as the distribution's root,
//	                               creates DIR/ext4.vhdx
//	-d NAME -u root --exec PATH ARGS...
//	                               runs PATH as root inside the distribution
//	                               (its stdio is the caller's pipes, passed
//	                               through: the real oac-guest over stdio://)
//	                               and exits with its status; see below
//	--terminate NAME               kills every process of the distribution (those
//	                               whose root is its root directory)
//	--unregister NAME              terminates and deletes the distribution
//
// Every argv is appended to $OAC_FAKE_WSL_STATE/argv.log. $OAC_FAKE_WSL_MODE
// selects failures: "missing" (no --version, like the inbox WSL), "old"
// (version 0.50.2), "nohyperv" (import fails as without the Virtual Machine
// Platform), "ignore-wslconf" (the distribution's /etc/wsl.conf is ignored,
// as by a WSL older than its keys or once a user emptied it).
//
// The distribution's /etc/wsl.conf is honoured as WSL documents it for
// the doors it controls: [automount] enabled=false mounts no drive,
// [interop] enabled=false registers no WSLInterop and sets no $WSL_INTEROP,
// appendWindowsPath=false appends nothing to $PATH. The rest is what WSL
// makes by default (without a wsl.conf, every door below): a fake
// emulates the platform's defaults, the doors to the host included, not an
// ideal platform: the guest has to close these doors for its workload on a
// real WSL, and a test proves it does only if the doors are there. Running
// a command (distro.go):
//
//   - a PID namespace of its own, whose pid 1 is an init (this binary, in
//     a mode of its own, standing in for WSL's /init: it reaps orphans and
//     reports the command's status) and whose command is its child; host
//     processes are not visible. wsl.exe stays outside, waits and exits
//     with the command's status (killed when it was killed, 128+n for
//     another signal); killing wsl.exe kills the init (parent-death
//     signal), and so every process of the distribution, as a pid
//     namespace ends with its pid 1;
//   - a mount namespace of its own, chrooted into the distribution's root
//     (a bind mount of itself), with /proc (of the new pid namespace), the
//     host's /dev, tmpfs /run and /tmp; in the network namespace
//     $OAC_FAKE_WSL_NETNS when set (a WSL2 distribution shares the utility
//     VM's network, which has a real interface);
//   - the doors WSL opens by default: the Windows drive C: at /mnt/c
//     (drvfs: writable, every file the default user's, uid 1000; here a
//     bind of $OAC_FAKE_WSL_STATE/drives/c, shared by every distribution,
//     holding Windows/System32/cmd.exe and Users/user/Documents/secret.txt);
//     /mnt/wsl, shared by every distribution ($OAC_FAKE_WSL_STATE/shared/wsl);
//     WSLg's /mnt/wslg (tmpfs) with the listening sockets PulseServer and
//     .X11-unix/X0, and /tmp/.X11-unix a read-only bind of its .X11-unix;
//     interop: the listening socket /run/WSL/1_interop, $WSL_INTEROP naming
//     it, the interpreter /init (a read-only bind of this binary) and its
//     binfmt_misc registration WSLInterop (a read-only tmpfs over
//     /proc/sys/fs/binfmt_misc: binfmt_misc is the host's, global, and a
//     test never registers a handler there, so a Windows binary does not
//     actually run); the Windows PATH appended to $PATH, and WSL_DISTRO_NAME
//     and WSLENV set. The sockets are served by wsl.exe, outside the
//     distribution's pid namespace (a connection is accepted and closed),
//     as the real ones are by WSL's init and Windows.
package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf16"
)

// wsl.exe starts the distribution's init from the main thread (a parent
// thread's exit would send the init its parent-death signal), and the init
// enters the network namespace on its main thread (namespaces are per
// thread), from which it starts the command.
func init() { runtime.LockOSThread() }

var state = os.Getenv("OAC_FAKE_WSL_STATE")

func main() {
	if state == "" {
		fail("OAC_FAKE_WSL_STATE is not set")
	}
	args := os.Args[1:]
	if len(args) >= 3 && args[0] == initArg {
		distroInit(args[1], args[2], args[2:])
	}
	if f, err := os.OpenFile(filepath.Join(state, "argv.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
		b, _ := json.Marshal(args)
		f.Write(append(b, '\n'))
		f.Close()
	}
	mode := os.Getenv("OAC_FAKE_WSL_MODE")
	switch {
	case len(args) == 1 && args[0] == "--version":
		switch mode {
		case "missing":
			say("Invalid command line option: --version\nUsage: wsl.exe [Argument] [Options...] [CommandLine]\n")
			os.Exit(1)
		case "old":
			say("WSL version: 0.50.2.0\nKernel version: 5.10.102.1\n")
		default:
			say("WSL version: 2.1.5.0\nKernel version: 5.15.146.1-2\nWSLg version: 1.0.60\nWindows version: 10.0.22631.3296\n")
		}
	case len(args) == 2 && args[0] == "--list" && args[1] == "--quiet":
		names := distros()
		if len(names) == 0 {
			say("Windows Subsystem for Linux has no installed distributions.\nError code: Wsl/WSL_E_DEFAULT_DISTRO_NOT_FOUND\n")
			os.Exit(1)
		}
		say(strings.Join(names, "\n") + "\n")
	case len(args) == 6 && args[0] == "--import" && args[4] == "--version" && args[5] == "2":
		importDistro(args[1], args[2], args[3], mode)
	case len(args) >= 6 && args[0] == "-d" && args[2] == "-u" && args[3] == "root" && args[4] == "--exec":
		run(args[1], args[5], args[5:])
	case len(args) == 2 && args[0] == "--terminate":
		mustExist(args[1])
		terminate(args[1])
		say("The operation completed successfully.\n")
	case len(args) == 2 && args[0] == "--unregister":
		mustExist(args[1])
		terminate(args[1])
		b, _ := os.ReadFile(filepath.Join(state, "distros", args[1], "installdir"))
		os.Remove(filepath.Join(string(b), "ext4.vhdx"))
		os.RemoveAll(filepath.Join(state, "distros", args[1]))
		say("Unregistering.\nThe operation completed successfully.\n")
	default:
		fail(fmt.Sprintf("fakewsl: unexpected arguments %q", args))
	}
}

// say prints like wsl.exe: UTF-16LE with CRLF unless WSL_UTF8=1.
func say(s string) {
	s = strings.ReplaceAll(s, "\n", "\r\n")
	if os.Getenv("WSL_UTF8") == "1" {
		os.Stdout.WriteString(s)
		return
	}
	u := utf16.Encode([]rune(s))
	b := make([]byte, 2*len(u))
	for i, c := range u {
		b[2*i], b[2*i+1] = byte(c), byte(c>>8)
	}
	os.Stdout.Write(b)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}

func distros() []string {
	ents, _ := os.ReadDir(filepath.Join(state, "distros"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func mustExist(name string) {
	if !slices.Contains(distros(), name) {
		say("There is no distribution with the supplied name.\nError code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\n")
		os.Exit(1)
	}
}

func importDistro(name, dir, tarball, mode string) {
	if slices.Contains(distros(), name) {
		say("A distribution with the supplied name already exists. Use --name to choose a different name.\nError code: Wsl/Service/RegisterDistro/ERROR_ALREADY_EXISTS\n")
		os.Exit(1)
	}
	if mode == "nohyperv" {
		say("Please enable the Virtual Machine Platform Windows feature and ensure virtualization is enabled in the BIOS.\nError code: Wsl/Service/RegisterDistro/CreateVm/HCS/HCS_E_HYPERV_NOT_INSTALLED\n")
		os.Exit(1)
	}
	root := filepath.Join(state, "distros", name, "rootfs")
	if err := unpack(tarball, root); err != nil {
		os.RemoveAll(filepath.Join(state, "distros", name))
		say("The specified file is not a valid tar archive: " + err.Error() + "\nError code: Wsl/Service/RegisterDistro/0x8007017c\n")
		os.Exit(1)
	}
	if err := os.MkdirAll(dir, 0o700); err == nil {
		os.WriteFile(filepath.Join(dir, "ext4.vhdx"), nil, 0o600)
	}
	os.WriteFile(filepath.Join(state, "distros", name, "installdir"), []byte(dir), 0o600)
	say("Import in progress, this may take a few minutes.\nThe operation completed successfully.\n")
}

// unpack extracts a gzip'd tarball as root would: directories, regular
// files and symlinks with their modes and numeric owners.
func unpack(tarball, root string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	n := 0
	type dirMode struct {
		path string
		mode os.FileMode
	}
	var dirs []dirMode
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := filepath.Clean("/" + h.Name)
		dst := filepath.Join(root, name)
		mode := h.FileInfo().Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if name == "/" {
				continue
			}
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
			dirs = append(dirs, dirMode{dst, mode})
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			out.Close()
			n++
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, dst); err != nil {
				return err
			}
		default:
			continue
		}
		if err := os.Lchown(dst, h.Uid, h.Gid); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if err := os.Chmod(dst, mode); err != nil {
				return err
			}
		}
	}
	// Directory modes last: a 0700 directory must stay enterable while
	// its entries are written.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i].path, dirs[i].mode); err != nil {
			return err
		}
	}
	if n == 0 {
		return errors.New("no files")
	}
	return nil
}

// terminate kills every process of the distribution: those whose root
// directory is its root (a recycled pid is someone else's and has
// another root).
func terminate(name string) {
	root := filepath.Join(state, "distros", name, "rootfs")
	for range 50 {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if r, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err == nil && r == root {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Remove(filepath.Join(state, "distros", name, "pid"))
}
