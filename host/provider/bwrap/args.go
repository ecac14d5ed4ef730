package bwrap

import (
	"strconv"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Paths inside the guest.
const (
	GuestAgentPath  = kit.GuestAgentPath
	GuestSocketPath = kit.GuestSocketPath
	GuestInstallDir = kit.GuestInstallDir
)

// RuntimeDirs get a tmpfs of their own (0755, owned by guest root), or a
// host directory bound read-write (a volume): the guest's writable /home
// and /environment, where the agent creates /home/runtime and
// /environment/workspace for uid 1000.
var RuntimeDirs = provider.VolumeDirs

// volumeFD is a host directory bound read-write at Dir.
type volumeFD struct {
	Dir string
	FD  int
}

// installFD is a host binary bound read-only at GuestInstallDir/Name.
type installFD struct {
	Name string
	FD   int
	// Copy: FD is readable and bwrap copies the binary in (see
	// bindBinary).
	Copy bool
}

// bindBinary binds the binary at fd read-only at dest. With copy, bwrap
// copies it into the sandbox instead (0755, owned by guest root): a
// binary the guest's root cannot reach on the host (a parent directory
// not searchable by others, such as /root/go/bin) or a file not readable
// and executable by others, which a bind would show to uid 1000 as it is.
func bindBinary(fd int, copy bool, dest string) []string {
	if copy {
		return []string{"--perms", "0755", "--ro-bind-data", strconv.Itoa(fd), dest}
	}
	return []string{"--ro-bind-fd", strconv.Itoa(fd), dest}
}

// argsConfig is everything the bwrap command line depends on.
type argsConfig struct {
	// RootFD is the O_PATH fd of a rootfs directory, or -1 for the default
	// read-only view of the host.
	RootFD int
	// HostEntries make up the default root (ignored with RootFD).
	HostEntries []kit.HostEntry
	// EtcDir is the default root's /etc, a prepared directory bound
	// read-only (kit.PreparedEtc); EtcFiles are host files bound read-only
	// over files in it, as guest path -> host path.
	EtcDir   string
	EtcFiles [][2]string
	AgentFD  int
	// AgentCopy: AgentFD is readable and copied in (see bindBinary).
	AgentCopy bool
	SocketFD  int
	// Mode decides who builds the user namespace: the shim (ModeRoot),
	// bwrap blocked on BlockFD while newuidmap/newgidmap map it
	// (ModeSubIDs, bwrap reports its child's pid on InfoFD), or bwrap
	// alone with one uid (ModeSingleUID).
	Mode            Mode
	InfoFD, BlockFD int
	// DisableUserns passes --disable-userns (ModeSingleUID only; see
	// features).
	DisableUserns bool
	Hostname      string
	// Tmpfs are the RuntimeDirs to mount (with a rootfs: those it has).
	Tmpfs []string
	// Volumes are RuntimeDirs bound from host directories instead.
	Volumes []volumeFD
	// KeptLocal, for a kept sandbox, are the fds of its /usr/local, bin
	// and sbin (kit.Kept), bound read-write in that order in place of
	// the default root's tmpfs or the rootfs's own; Installs are bound
	// over their files as usual.
	KeptLocal []int
	// Installs are bound under GuestInstallDir. In the default root
	// /usr/local is a fresh tmpfs for them (the host's /usr/local is not
	// shown), remounted read-only afterwards; a rootfs must already have
	// each file (a read-only root cannot get new mount points).
	Installs []installFD
}

// buildArgs returns bwrap's arguments, agent command included.
func buildArgs(c argsConfig) []string {
	a := []string{
		"--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
		"--die-with-parent", "--as-pid-1", "--new-session", "--clearenv",
	}
	switch c.Mode {
	case ModeSubIDs:
		a = append(a, "--unshare-user", "--userns-block-fd", strconv.Itoa(c.BlockFD), "--info-fd", strconv.Itoa(c.InfoFD),
			"--uid", "0", "--gid", "0", "--cap-add", "ALL")
	case ModeSingleUID:
		a = append(a, "--unshare-user", "--uid", "1000", "--gid", "1000")
		for _, c := range SingleUIDCaps {
			a = append(a, "--cap-add", c)
		}
		if c.DisableUserns {
			a = append(a, "--disable-userns")
		}
	}
	if c.Hostname != "" {
		a = append(a, "--hostname", c.Hostname)
	}
	if c.RootFD >= 0 {
		a = append(a, "--ro-bind-fd", strconv.Itoa(c.RootFD), "/")
	} else {
		for _, e := range c.HostEntries {
			if e.Symlink != "" {
				a = append(a, "--symlink", e.Symlink, e.Path)
			} else {
				a = append(a, "--ro-bind", e.Path, e.Path)
			}
		}
		if c.EtcDir != "" {
			a = append(a, "--ro-bind", c.EtcDir, "/etc")
		} else {
			a = append(a, "--dir", "/etc")
		}
		for _, f := range c.EtcFiles {
			a = append(a, "--ro-bind", f[1], f[0])
		}
	}
	a = append(a,
		"--proc", "/proc",
		"--dev", "/dev",
		"--perms", "1777", "--tmpfs", "/tmp",
		"--tmpfs", "/run",
		"--dir", "/run/oac",
	)
	a = append(a, bindBinary(c.AgentFD, c.AgentCopy, GuestAgentPath)...)
	a = append(a, "--bind-fd", strconv.Itoa(c.SocketFD), GuestSocketPath)
	for _, d := range c.Tmpfs {
		a = append(a, "--perms", "0755", "--tmpfs", d)
	}
	for _, v := range c.Volumes {
		a = append(a, "--bind-fd", strconv.Itoa(v.FD), v.Dir)
	}
	if len(c.KeptLocal) == 3 {
		for i, d := range []string{"/usr/local", "/usr/local/bin", "/usr/local/sbin"} {
			a = append(a, "--bind-fd", strconv.Itoa(c.KeptLocal[i]), d)
		}
		for _, in := range c.Installs {
			a = append(a, bindBinary(in.FD, in.Copy, GuestInstallDir+"/"+in.Name)...)
		}
	} else if len(c.Installs) > 0 {
		if c.RootFD < 0 {
			a = append(a, "--perms", "0755", "--tmpfs", "/usr/local", "--perms", "0755", "--dir", GuestInstallDir)
		}
		for _, in := range c.Installs {
			a = append(a, bindBinary(in.FD, in.Copy, GuestInstallDir+"/"+in.Name)...)
		}
		if c.RootFD < 0 {
			a = append(a, "--remount-ro", "/usr/local")
		}
	}
	a = append(a,
		"--chdir", "/",
		"--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		GuestAgentPath, "--transport", "unix://"+GuestSocketPath,
	)
	return a
}
