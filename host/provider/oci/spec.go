package oci

import (
	"fmt"
	"path"
	"slices"
	"sort"

	"github.com/oac/sandbox-agent/host/provider/kit"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// specVersion is the runtime-spec version written into config.json: the
// one runc 1.1 and crun 1.8 implement.
const specVersion = "1.0.2"

// AgentCaps are the only capabilities the agent keeps (bounding,
// effective, permitted; none inheritable or ambient, so the processes it
// starts as uid 1000 have none): the hosted contract's (kit.AgentCaps,
// which says why each is needed) and CAP_SETFCAP, with which (and with
// CAP_SETUID and CAP_SETGID) the agent maps the guest's ids into the
// nested user namespace that gives the daemon a mount namespace of its own
// (Linux 5.12 and later require it to map id 0; docs/workload.md). The
// runtime mounts everything and sets the hostname and lo up, so the agent
// needs no CAP_SYS_ADMIN.
var AgentCaps = capNames(append(slices.Clone(kit.AgentCaps), "SETFCAP"))

// capNames returns names as the runtime spec's CAP_ names, sorted.
func capNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "CAP_" + n
	}
	slices.Sort(out)
	return out
}

// deniedSyscalls fail with EPERM in the guest: kernel interfaces a sandboxed
// daemon has no use for and that have a history of privilege escalations
// (the core of Docker's default profile's deny list, for syscalls that
// capabilities alone do not gate).
var deniedSyscalls = []string{
	"add_key", "bpf", "fanotify_init", "kexec_file_load", "kexec_load", "keyctl",
	"open_by_handle_at", "perf_event_open", "request_key", "userfaultfd",
}

// bundleConfig is everything config.json depends on.
type bundleConfig struct {
	// RootPath is the host directory used as the read-only root: the
	// --rootfs directory, or the provider's own skeleton for the default
	// view of the host.
	RootPath string
	// HostEntries are bound read-only into the default root (directories
	// only; symlinks are made in the skeleton).
	HostEntries []kit.HostEntry
	// EtcFiles are bound read-only as guest path -> host path.
	EtcFiles [][2]string
	// RunDir is the host directory bound at /run/oac: it holds the
	// transport socket and the agent binary's mount point.
	RunDir string
	// Writable are the guest's /home and /environment (those the root
	// has): a fresh tmpfs each, or a volume's host directory bound
	// read-write.
	Writable []writableDir
	// LocalDir, in the default root with installs, is a host directory
	// bound read-only at /usr/local: its bin/ holds a mount point for
	// each install (the host's /usr/local is not shown).
	LocalDir string
	// Kept, for a kept sandbox, is its state: its usr-local is bound
	// read-write at /usr/local, and its bin and sbin again on their own
	// (mount points the workload cannot rename), instead of LocalDir.
	Kept *kit.Kept
	// Installs are host binaries bound read-only at
	// /usr/local/bin/NAME, as name -> host path pairs in name order.
	Installs [][2]string
	// ResolvConf, when set, is bound read-only at /etc/resolv.conf over
	// the one a --rootfs has (the default root has it in EtcFiles).
	ResolvConf string
	AgentPath  string
	Hostname   string
	// IDBase is the host id guest id 0 maps to; IDSize ids are mapped.
	IDBase, IDSize int
	// CgroupsPath is the container's cgroup.
	CgroupsPath string
	// NoNewPrivileges sets no_new_privs on the agent itself.
	NoNewPrivileges bool
	Debug           bool
}

// writableDir is one of provider.VolumeDirs: Host is a volume's host
// directory, "" for a tmpfs.
type writableDir struct{ Dir, Host string }

// buildSpec returns the container's config.json.
func buildSpec(c bundleConfig) *specs.Spec {
	args := []string{kit.GuestAgentPath, "--transport", "unix://" + kit.GuestSocketPath}
	if c.Debug {
		args = append(args, "--debug")
	}
	caps := append([]string(nil), AgentCaps...)
	s := &specs.Spec{
		Version:  specVersion,
		Hostname: c.Hostname,
		Root:     &specs.Root{Path: c.RootPath, Readonly: true},
		Process: &specs.Process{
			Args: args,
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: c.NoNewPrivileges,
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.UserNamespace}, {Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: uint32(c.IDBase), Size: uint32(c.IDSize)}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: uint32(c.IDBase), Size: uint32(c.IDSize)}},
			CgroupsPath: c.CgroupsPath,
			Resources: &specs.LinuxResources{
				Pids: &specs.LinuxPids{Limit: ptr(int64(kit.PidsLimit))},
				// No device but the runtime's defaults (null, zero, full,
				// random, urandom, tty, ptmx).
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Seccomp:       seccomp(),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	s.Mounts = mounts(c)
	return s
}

func seccomp() *specs.LinuxSeccomp {
	names := append([]string(nil), deniedSyscalls...)
	sort.Strings(names)
	errno := uint(1) // EPERM
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32, specs.ArchAARCH64, specs.ArchARM},
		Syscalls:      []specs.LinuxSyscall{{Names: names, Action: specs.ActErrno, ErrnoRet: &errno}},
	}
}

// maskedPaths and readonlyPaths are the usual /proc and /sys entries a
// container must not read or write.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

func mounts(c bundleConfig) []specs.Mount {
	nosuidNodev := []string{"nosuid", "nodev"}
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		// sysfs cannot be mounted in a user namespace that does not own
		// the host's network namespace on every kernel: bind it read-only.
		{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}},
	}
	for _, e := range c.HostEntries {
		if e.Symlink == "" {
			ms = append(ms, specs.Mount{Destination: e.Path, Type: "bind", Source: e.Path, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
		}
	}
	for _, f := range c.EtcFiles {
		// rbind: what is mounted below a shared /etc entry (a CA bundle
		// bound over the host's) shows too.
		ms = append(ms, specs.Mount{Destination: f[0], Type: "bind", Source: f[1], Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	ms = append(ms,
		specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: append(nosuidNodev, "mode=1777", fmt.Sprintf("size=%dm", kit.TmpSizeMiB))},
		specs.Mount{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: append(nosuidNodev, "mode=755", fmt.Sprintf("size=%dm", kit.RunSizeMiB))},
		specs.Mount{Destination: kit.GuestRunDir, Type: "bind", Source: c.RunDir, Options: []string{"bind", "nosuid", "nodev", "noexec"}},
		specs.Mount{Destination: kit.GuestAgentPath, Type: "bind", Source: c.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	)
	if c.ResolvConf != "" {
		ms = append(ms, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: c.ResolvConf, Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	for _, w := range c.Writable {
		if w.Host == "" {
			// Owned by guest root (the runtime mounts it inside the
			// user namespace): the agent creates /home/runtime and
			// /environment/workspace for uid 1000 itself.
			ms = append(ms, specs.Mount{Destination: w.Dir, Type: "tmpfs", Source: "tmpfs", Options: append(nosuidNodev, "mode=755")})
		} else {
			ms = append(ms, specs.Mount{Destination: w.Dir, Type: "bind", Source: w.Host, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
		}
	}
	if c.LocalDir != "" {
		ms = append(ms, specs.Mount{Destination: "/usr/local", Type: "bind", Source: c.LocalDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if k := c.Kept; k != nil {
		for _, m := range [][2]string{{"/usr/local", k.UsrLocal}, {"/usr/local/bin", k.Bin()}, {"/usr/local/sbin", k.Sbin()}} {
			ms = append(ms, specs.Mount{Destination: m[0], Type: "bind", Source: m[1], Options: []string{"bind", "rw", "nosuid", "nodev"}})
		}
	}
	for _, in := range c.Installs {
		ms = append(ms, specs.Mount{Destination: kit.GuestInstallDir + "/" + in[0], Type: "bind", Source: in[1], Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	return ms
}

// ContainerID is the runtime's id of a sandbox: unique per host because
// sandbox names are (the state directory's lock).
func ContainerID(name string) string { return "oac-" + name }

// cgroupsPath returns the container's cgroup, relative to each hierarchy's
// root.
func cgroupsPath(name string) string { return path.Join("/oac", name) }

func ptr[T any](v T) *T { return &v }
