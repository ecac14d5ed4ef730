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
//	                               execs PATH inside the distribution, in place of
//	                               this process (its stdio is the caller's pipes:
//	                               the real oac-guest over stdio://): as root,
//	                               chrooted into the distribution's root (a bind
//	                               mount of itself), in a mount
//	                               namespace of its own with /proc, the host's /dev
//	                               and tmpfs /run and /tmp, and in the network
//	                               namespace $OAC_FAKE_WSL_NETNS when set (a WSL2
//	                               distribution shares the utility VM's network,
//	                               which has a real interface)
//	--terminate NAME               kills every process of the distribution (those
//	                               whose root is its root directory)
//	--unregister NAME              terminates and deletes the distribution
//
// Every argv is appended to $OAC_FAKE_WSL_STATE/argv.log. $OAC_FAKE_WSL_MODE
// selects failures: "missing" (no --version, like the inbox WSL), "old"
// (version 0.50.2), "nohyperv" (import fails as without the Virtual Machine
// Platform).
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

	"golang.org/x/sys/unix"
)

// The distribution is entered on the main thread, which then execs the
// agent: namespaces and the root are per thread until exec.
func init() { runtime.LockOSThread() }

var state = os.Getenv("OAC_FAKE_WSL_STATE")

func main() {
	if state == "" {
		fail("OAC_FAKE_WSL_STATE is not set")
	}
	args := os.Args[1:]
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

// run execs path inside the "distribution" in place of this process, so
// the caller's pipes are the agent's stdio and killing wsl.exe kills it.
func run(name, path string, argv []string) {
	if !slices.Contains(distros(), name) {
		say("There is no distribution with the supplied name.\nError code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\n")
		os.Exit(1)
	}
	root := filepath.Join(state, "distros", name, "rootfs")
	os.WriteFile(filepath.Join(state, "distros", name, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	if err := enter(root); err != nil {
		fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: fake distribution %s: %v\n", name, err)
		os.Exit(1)
	}
	err := syscall.Exec(filepath.Clean("/"+path), argv, os.Environ())
	fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: CreateProcessEntryCommon:370: execvpe %s failed 2: %v\n", path, err)
	os.Exit(1)
}

// enter puts the calling thread into the distribution: its network (when
// the test gave one), a mount namespace of its own and its root.
func enter(root string) error {
	if p := os.Getenv("OAC_FAKE_WSL_NETNS"); p != "" {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", p, err)
		}
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The distribution's root is a mount of its own, as in WSL (the
	// agent's launcher makes the mounts below it private).
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", root, err)
	}
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"/dev", "dev", "", unix.MS_BIND | unix.MS_REC, ""},
		{"tmpfs", "run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=755"},
		{"tmpfs", "tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		dst := filepath.Join(root, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.src, dst, err)
		}
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	return unix.Chdir("/")
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
