//go:build linux

// Command fakewsl stands in for wsl.exe in the WSL provider's end-to-end
// tests on Linux. It honours the argv the provider uses and keeps its
// "distributions" in $OAC_FAKE_WSL_STATE:
//
//	--version                      prints a WSL version (UTF-16LE unless WSL_UTF8=1)
//	--list --quiet                 lists imported distributions
//	--import NAME DIR TAR --version 2
//	                               unpacks sbin/oac-guest from the gzip'd tarball,
//	                               creates DIR/ext4.vhdx
//	-d NAME -u root --exec PATH ARGS...
//	                               execs PATH of the distribution (its stdio is the
//	                               caller's pipes: the real oac-guest over stdio://)
//	--terminate NAME               kills what -d started
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf16"
)

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

// unpack extracts the regular files of a gzip'd tarball (enough for the
// agent binary).
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
	n := 0
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
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			out.Close()
			n++
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
	bin := filepath.Join(state, "distros", name, "rootfs", filepath.Clean("/"+path))
	os.WriteFile(filepath.Join(state, "distros", name, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	err := syscall.Exec(bin, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: CreateProcessEntryCommon:370: execvpe %s failed 2: %v\n", path, err)
	os.Exit(1)
}

func terminate(name string) {
	b, err := os.ReadFile(filepath.Join(state, "distros", name, "pid"))
	if err != nil {
		return
	}
	// Only the process this fake started: its command line is the
	// distribution's binary (a recycled pid is someone else's).
	if pid, err := strconv.Atoi(string(b)); err == nil && pid > 0 {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if len(cmdline) > 0 && strings.HasPrefix(exe, filepath.Join(state, "distros", name)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.Remove(filepath.Join(state, "distros", name, "pid"))
}
