//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg is the fake's first argument when it runs as a distribution's
// init (never a wsl.exe argv: it is not logged).
const initArg = "--fake-wsl-init"

// interopSocket is WSL's interop server in the distribution ($WSL_INTEROP).
const interopSocket = "/run/WSL/1_interop"

// doorSockets are the listening sockets wsl.exe serves in the
// distribution, by their paths there.
var doorSockets = []string{interopSocket, "/mnt/wslg/PulseServer", "/mnt/wslg/.X11-unix/X0"}

// windowsPath is what WSL appends to $PATH (appendWindowsPath=true).
const windowsPath = ":/mnt/c/Windows/System32:/mnt/c/Windows:/mnt/c/Windows/System32/WindowsPowerShell/v1.0:/mnt/c/Users/user/AppData/Local/Microsoft/WindowsApps"

// run runs path in the distribution, with the caller's stdio, and exits
// with its status (dies of SIGKILL when it did). wsl.exe starts the
// distribution's init in new pid and mount namespaces; the init mounts
// the distribution and says so over a socket pair; wsl.exe then listens on
// the door sockets (through /proc/INIT/root, so their server is outside
// the distribution) and lets the init start the command; the init reports
// the command's wait status before it exits.
func run(name, path string, argv []string) {
	if !slices.Contains(distros(), name) {
		say("There is no distribution with the supplied name.\nError code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\n")
		os.Exit(1)
	}
	os.WriteFile(filepath.Join(state, "distros", name, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	if err := sharedDirs(); err != nil {
		fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: fake drives: %v\n", err)
		os.Exit(1)
	}
	self, err := os.Executable()
	if err != nil {
		fail(err.Error())
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fail(err.Error())
	}
	sync, initEnd := os.NewFile(uintptr(fds[0]), "sync"), os.NewFile(uintptr(fds[1]), "sync")
	cmd := exec.Command(self, append([]string{initArg, name}, argv...)...)
	cmd.Args[0] = "/init"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = distroEnv(name, readWSLConf(name))
	cmd.ExtraFiles = []*os.File{initEnd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fail("fakewsl: start the distribution's init: " + err.Error())
	}
	initEnd.Close()
	// EOF instead: the init failed (and said why).
	if _, err := io.ReadFull(sync, make([]byte, 1)); err == nil {
		for _, p := range doorSockets {
			if err := serve(fmt.Sprintf("/proc/%d/root%s", cmd.Process.Pid, p)); err != nil {
				fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: fake %s: %v\n", p, err)
				cmd.Process.Kill()
				cmd.Wait()
				os.Exit(1)
			}
		}
		sync.Write([]byte{'g'})
	}
	cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	var b [4]byte
	if _, err := io.ReadFull(sync, b[:]); err == nil {
		ws = syscall.WaitStatus(binary.LittleEndian.Uint32(b[:]))
	}
	if ws.Signaled() {
		// A killed distribution (--terminate, a killed command) kills
		// wsl.exe too; another signal is 128+n, as a shell says it (Go's
		// runtime would not die of every signal as the command did).
		if ws.Signal() == syscall.SIGKILL {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
}

// serve listens on the unix socket path (anyone may connect, as to the
// real ones) and accepts and closes connections while wsl.exe runs.
func serve(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o777); err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return nil
}

// sharedDirs makes what every distribution shares: the Windows drive C:
// (files of its own, and drvfs's default metadata: every file uid 1000's,
// rwx for all) and /mnt/wsl.
func sharedDirs() error {
	if err := os.MkdirAll(filepath.Join(state, "shared", "wsl"), 0o755); err != nil {
		return err
	}
	c := filepath.Join(state, "drives", "c")
	for rel, body := range map[string]string{
		"Windows/System32/cmd.exe":        "MZ\x90\x00\x03\x00\x00\x00 a fake cmd.exe\n",
		"Users/user/Documents/secret.txt": "a Windows user's document\n",
	} {
		p := filepath.Join(c, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			return err
		}
		if f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o777); err == nil {
			f.WriteString(body)
			f.Close()
		} else if !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return filepath.WalkDir(c, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, 1000, 1000); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		return os.Chmod(p, 0o777)
	})
}

// distroEnv is the command's environment: the caller's, with WSL's
// additions.
func distroEnv(name string, conf wslConf) []string {
	path, ok := os.LookupEnv("PATH")
	if !ok {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "PATH" || k == "WSL_DISTRO_NAME" || k == "WSLENV" || k == "WSL_INTEROP"
	})
	if conf.appendWindowsPath {
		path += windowsPath
	}
	env = append(env, "PATH="+path, "WSL_DISTRO_NAME="+name, "WSLENV=")
	if conf.interop {
		env = append(env, "WSL_INTEROP="+interopSocket)
	}
	return env
}

// wslConf is what WSL reads of the distribution's /etc/wsl.conf (the keys
// that open doors), with WSL's defaults for what the file does not say.
type wslConf struct{ automount, interop, appendWindowsPath bool }

// readWSLConf reads the distribution's /etc/wsl.conf as WSL does: INI,
// "key = value", booleans "true"/"false", comments with # or ;. With
// $OAC_FAKE_WSL_MODE "ignore-wslconf" the file is ignored, as by a WSL
// older than its keys or after a user emptied it: WSL's defaults, every
// door open.
func readWSLConf(name string) wslConf {
	c := wslConf{automount: true, interop: true, appendWindowsPath: true}
	if os.Getenv("OAC_FAKE_WSL_MODE") == "ignore-wslconf" {
		return c
	}
	b, err := os.ReadFile(filepath.Join(state, "distros", name, "rootfs", "etc", "wsl.conf"))
	if err != nil {
		return c
	}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.ToLower(strings.Trim(line, "[] "))
		default:
			k, v, _ := strings.Cut(line, "=")
			on := strings.EqualFold(strings.Trim(strings.TrimSpace(v), `"`), "true")
			switch section + "." + strings.ToLower(strings.TrimSpace(k)) {
			case "automount.enabled":
				c.automount = on
			case "interop.enabled":
				c.interop = on
			case "interop.appendwindowspath":
				c.appendWindowsPath = on
			}
		}
	}
	return c
}

// distroInit is pid 1 of the distribution: it enters it, waits for
// wsl.exe to serve the door sockets, starts the command, reaps every
// process that ends, and exits when the command has (the kernel then
// kills the rest of the pid namespace), reporting its wait status to
// wsl.exe on fd 3 first.
func distroInit(name, path string, argv []string) {
	sync := os.NewFile(3, "sync")
	unix.CloseOnExec(3)
	if err := enter(filepath.Join(state, "distros", name, "rootfs"), readWSLConf(name)); err != nil {
		fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: fake distribution %s: %v\n", name, err)
		os.Exit(1)
	}
	if _, err := sync.Write([]byte{'m'}); err != nil {
		os.Exit(1)
	}
	if _, err := io.ReadFull(sync, make([]byte, 1)); err != nil {
		os.Exit(1) // wsl.exe is gone
	}
	p, err := os.StartProcess(filepath.Clean("/"+path), argv, &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(os.Stderr, "<3>WSL (1) ERROR: CreateProcessEntryCommon:370: execvpe %s failed 2: %v\n", path, err)
		os.Exit(1)
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			os.Exit(1)
		}
		if pid != p.Pid {
			continue
		}
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(ws))
		sync.Write(b[:])
		if ws.Signaled() {
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(ws.ExitStatus())
	}
}

// enter puts the init into the distribution (its mount namespace is new,
// made by wsl.exe): the network namespace (when the test gave one) on
// this thread, the distribution's mounts, and its root.
func enter(root string, conf wslConf) error {
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
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The distribution's root is a mount of its own, as in WSL (the
	// agent's launcher makes the mounts below it private).
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", root, err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	const nosuid, nodev, noexec = unix.MS_NOSUID, unix.MS_NODEV, unix.MS_NOEXEC
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
		file             bool               // the mount point is a file
		fill             func(string) error // writes the new mount's files
		ro               bool               // then made read-only
		off              bool               // wsl.conf turned it off
	}{
		// /proc of the init's pid namespace: only the distribution's processes.
		{src: "proc", dst: "proc", fstype: "proc", flags: nosuid | nodev | noexec},
		// WSL's interop registration, as binfmt_misc would show it (the
		// host's binfmt_misc is global: never registered here).
		{src: "binfmt_misc", dst: "proc/sys/fs/binfmt_misc", fstype: "tmpfs", flags: nosuid | nodev | noexec, data: "mode=755", fill: binfmt(conf.interop), ro: true},
		{src: "/dev", dst: "dev", flags: unix.MS_BIND | unix.MS_REC},
		{src: "tmpfs", dst: "run", fstype: "tmpfs", flags: nosuid | nodev, data: "mode=755", fill: mkdir("WSL", 0o755)},
		{src: "tmpfs", dst: "tmp", fstype: "tmpfs", flags: nosuid | nodev, data: "mode=1777"},
		// The Windows drive and /mnt/wsl, shared by every distribution.
		{src: filepath.Join(state, "drives", "c"), dst: "mnt/c", flags: unix.MS_BIND, off: !conf.automount},
		{src: filepath.Join(state, "shared", "wsl"), dst: "mnt/wsl", flags: unix.MS_BIND},
		// WSLg: its sockets (served by wsl.exe) in a tmpfs, and X11's
		// socket directory bound read-only into /tmp.
		{src: "none", dst: "mnt/wslg", fstype: "tmpfs", data: "mode=755", fill: mkdir(".X11-unix", 0o777)},
		{src: filepath.Join(root, "mnt/wslg/.X11-unix"), dst: "tmp/.X11-unix", flags: unix.MS_BIND, ro: true},
		// WSL's interop interpreter.
		{src: self, dst: "init", flags: unix.MS_BIND, file: true, ro: true},
	} {
		if m.off {
			continue
		}
		dst := filepath.Join(root, m.dst)
		if err := mountPoint(dst, m.file); err != nil {
			return err
		}
		if err := unix.Mount(m.src, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.src, dst, err)
		}
		if m.fill != nil {
			if err := m.fill(dst); err != nil {
				return err
			}
		}
		if m.ro {
			if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|m.flags&(nosuid|nodev|noexec), ""); err != nil {
				return fmt.Errorf("make %s read-only: %w", dst, err)
			}
		}
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	return unix.Chdir("/")
}

// mountPoint makes dst (a directory, or an empty file) unless it exists;
// a symlink there would be followed outside the distribution: refused.
func mountPoint(dst string, file bool) error {
	st, err := os.Lstat(dst)
	switch {
	case err == nil && st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("mount point %s is a symlink", dst)
	case err == nil:
		return nil
	case !file:
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	return f.Close()
}

func mkdir(name string, mode os.FileMode) func(string) error {
	return func(dir string) error {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, mode); err != nil {
			return err
		}
		return os.Chmod(p, mode) // not the umask's
	}
}

// binfmt writes binfmt_misc's files as WSL's registration leaves them
// (no WSLInterop entry when wsl.conf turned interop off).
func binfmt(interop bool) func(string) error {
	return func(dir string) error {
		files := map[string]string{"status": "enabled\n"}
		if interop {
			files["WSLInterop"] = "enabled\ninterpreter /init\nflags: PF\noffset 0\nmagic 4d5a\n"
		}
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
}
