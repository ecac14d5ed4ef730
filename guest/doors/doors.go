package doors

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// Kind names a door. Kinds are stable: they appear in messages and in the
// platform_door_open failure.
type Kind string

const (
	// WindowsDrive: a Windows drive (drvfs over 9p) under WSL's automount
	// root, writable, the user's whole profile on it.
	WindowsDrive Kind = "windows-drive"
	// SharedMount: /mnt/wsl (shared by every distribution of the user) or
	// any other mount under /mnt or /media.
	SharedMount Kind = "shared-mount"
	// HostShare: a filesystem of the host (9p, virtiofs, NFS, SMB, FUSE)
	// that is not one of the contract's shares; WSL's GPU drivers.
	HostShare Kind = "host-share"
	// Display: WSLg's X11, Wayland and PulseAudio sockets, served on the
	// Windows side.
	Display Kind = "display-socket"
	// Interop: WSL's interop (the WSLInterop binfmt handler, its socket
	// under /run/WSL, $WSL_INTEROP): Windows programs run as the Windows
	// user, outside every sandbox.
	Interop Kind = "wsl-interop"
	// WindowsPath: Windows directories appended to PATH.
	WindowsPath Kind = "windows-path"
	// HostSocket: a socket file mounted in from outside the guest.
	HostSocket Kind = "host-socket"
)

// Door is one way from the guest to the host the platform opened.
type Door struct {
	Kind Kind
	// Path is the mount point, directory, binfmt entry or variable.
	Path string
	// What says what it is and Close how the workload is kept from it.
	What, Close string
}

func (d Door) String() string { return fmt.Sprintf("%s %s (%s)", d.Kind, d.Path, d.What) }

// Plan is what the workload's launcher does in its own mount namespace
// (after making every mount a slave, so nothing propagates back) and
// what the agent leaves out of the workload's environment.
type Plan struct {
	// Detach are mount points to detach with everything below them; none
	// lies below another. Where the kernel refuses (a mount locked by a
	// user namespace) the launcher covers it instead.
	Detach []string `json:"detach,omitempty"`
	// Cover are directories to hide under an empty read-only tmpfs.
	Cover []string `json:"cover,omitempty"`
	// Mask are files made unreadable and unexecutable (package workload's
	// mask).
	Mask []string `json:"mask,omitempty"`
	// DropEnv are variables the workload never gets; PATH loses every
	// entry at or below a detached or covered path.
	DropEnv []string `json:"drop_env,omitempty"`
}

// Empty reports whether the plan closes nothing in the mount namespace.
func (p Plan) Empty() bool { return len(p.Detach)+len(p.Cover)+len(p.Mask) == 0 }

// Sources is what Find looks at.
type Sources struct {
	// Mounts is the agent's mount table.
	Mounts []*mountinfo.Info
	// Binfmt maps each binfmt_misc entry's name to its content.
	Binfmt map[string]string
	// Env is the agent's environment.
	Env []string
	// Shares are the contract's own share mount points (a VM's virtio-fs
	// shares, named by the host's flags): never doors.
	Shares []string
	// Lstat returns a path's type without following a symlink.
	Lstat func(path string) (fs.FileMode, error)
}

// hostShareTypes are filesystems that serve the host's files.
var hostShareTypes = []string{"9p", "drvfs", "virtiofs", "nfs", "nfs4", "cifs", "smb3", "vboxsf", "fuse"}

// InteropDir is where WSL's init keeps the interop sockets.
const InteropDir = "/run/WSL"

// displayEnv are the variables WSLg sets to its sockets.
var displayEnv = []string{"DISPLAY", "WAYLAND_DISPLAY", "PULSE_SERVER"}

// Find lists the doors in src and the plan that closes them for the
// workload.
func Find(src Sources) ([]Door, Plan) {
	var doors []Door
	var plan Plan
	for _, m := range src.Mounts {
		mp := path.Clean(m.Mountpoint)
		if mp == "/" || under(mp, src.Shares) {
			continue
		}
		kind, what := mountDoor(m, mp, src.Lstat)
		if kind == "" {
			continue
		}
		// The launcher covers it with an empty read-only tmpfs where the
		// workload's user namespace locks the mount (it cannot be
		// detached there).
		doors = append(doors, Door{Kind: kind, Path: mp, What: what, Close: "detached from the workload's mount namespace (or covered, where the namespace locks it)"})
		plan.Detach = append(plan.Detach, mp)
	}
	plan.Detach = topmost(plan.Detach)

	interop := false
	for _, name := range sortedKeys(src.Binfmt) {
		e := parseBinfmt(src.Binfmt[name])
		if !e.enabled || (name != "WSLInterop" && e.magic != "4d5a") {
			continue
		}
		interop = true
		how := "its socket hidden and $WSL_INTEROP dropped: without them it reaches no Windows process"
		// The interpreter (WSL's /init) is an interop client itself, run
		// directly; and without flag F the kernel resolves it at exec in
		// the workload's namespace. Masked either way.
		if e.interpreter != "" && isRegular(src.Lstat, e.interpreter) {
			plan.Mask = append(plan.Mask, e.interpreter)
			how = "its interpreter " + e.interpreter + " masked, " + how
		}
		doors = append(doors, Door{Kind: Interop, Path: "binfmt_misc/" + name,
			What: "runs Windows programs (MZ) through " + e.interpreter + " as the Windows user", Close: how})
	}
	if m, err := lstat(src.Lstat, InteropDir); err == nil && m.IsDir() && !under(InteropDir, plan.Detach) {
		interop = true
		doors = append(doors, Door{Kind: Interop, Path: InteropDir, What: "WSL's interop sockets", Close: "covered by an empty read-only tmpfs"})
		plan.Cover = append(plan.Cover, InteropDir)
	}

	plan.DropEnv = []string{"WSL_INTEROP"}
	for _, kv := range src.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "WSL_INTEROP":
			interop = true
			doors = append(doors, Door{Kind: Interop, Path: "$WSL_INTEROP", What: "the interop socket " + v, Close: "not passed to the workload"})
		case slices.Contains(displayEnv, k):
			doors = append(doors, Door{Kind: Display, Path: "$" + k, What: "WSLg's " + v, Close: "not passed to the workload"})
		case k == "PATH":
			for _, dir := range strings.Split(v, ":") {
				if windowsDir(dir, plan) {
					doors = append(doors, Door{Kind: WindowsPath, Path: "$PATH " + dir, What: "a Windows directory", Close: "dropped from the workload's PATH"})
				}
			}
		}
	}
	if interop || slices.ContainsFunc(doors, func(d Door) bool { return d.Kind == Display }) {
		plan.DropEnv = append(plan.DropEnv, displayEnv...)
	}
	return doors, plan
}

// mountDoor says whether the mount m (at mp) is a door, and which.
func mountDoor(m *mountinfo.Info, mp string, st func(string) (fs.FileMode, error)) (Kind, string) {
	share := slices.Contains(hostShareTypes, m.FSType) || strings.HasPrefix(m.FSType, "fuse.")
	switch {
	case m.FSType == "drvfs" || (m.FSType == "9p" && strings.Contains(m.VFSOptions, "aname=drvfs")) || driveSource(m.Source):
		return WindowsDrive, "Windows drive " + m.Source + " (" + m.FSType + ")"
	case driveLetter(mp):
		return WindowsDrive, "a drive under WSL's automount root (" + m.FSType + ")"
	case mp == "/mnt/wsl" || strings.HasPrefix(mp, "/mnt/wsl/"):
		return SharedMount, "shared by every WSL distribution of the user (" + m.FSType + ")"
	case mp == "/mnt/wslg" || strings.HasPrefix(mp, "/mnt/wslg/") || mp == "/tmp/.X11-unix":
		return Display, "WSLg's display and sound sockets (" + m.FSType + ")"
	case strings.HasPrefix(mp, "/usr/lib/wsl/"):
		return HostShare, "the host's GPU drivers and libraries (" + m.FSType + ")"
	case share:
		return HostShare, "a filesystem of the host (" + m.FSType + " " + m.Source + ")"
	case strings.HasPrefix(mp, "/mnt/") || strings.HasPrefix(mp, "/media/"):
		return SharedMount, "a mount under " + strings.SplitN(mp, "/", 3)[1] + " (" + m.FSType + ")"
	}
	if t, err := lstat(st, mp); err == nil && t.Type() == fs.ModeSocket {
		return HostSocket, "a socket mounted from outside (" + m.FSType + ")"
	}
	return "", ""
}

// driveSource reports a drvfs source such as `C:\` or `C:`.
func driveSource(s string) bool {
	return len(s) >= 2 && s[1] == ':' && isLetter(s[0]) && (len(s) == 2 || s[2:] == `\` || s[2:] == "/")
}

// driveLetter reports a mount point /mnt/X: WSL's default automount root.
func driveLetter(mp string) bool {
	return len(mp) == len("/mnt/c") && strings.HasPrefix(mp, "/mnt/") && isLetter(mp[5])
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// windowsDir reports a PATH entry on a Windows drive or below a path the
// plan closes.
func windowsDir(dir string, p Plan) bool {
	dir = path.Clean(dir)
	if len(dir) >= len("/mnt/c") && strings.HasPrefix(dir, "/mnt/") && isLetter(dir[5]) && (len(dir) == 6 || dir[6] == '/') {
		return true
	}
	return under(dir, p.Detach) || under(dir, p.Cover)
}

// CleanEnv returns env without the plan's variables and without PATH
// entries at or below what the plan closes (or on a Windows drive).
func (p Plan) CleanEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if slices.Contains(p.DropEnv, k) {
			continue
		}
		if k == "PATH" {
			var keep []string
			for _, dir := range strings.Split(v, ":") {
				if !windowsDir(dir, p) {
					keep = append(keep, dir)
				}
			}
			kv = "PATH=" + strings.Join(keep, ":")
		}
		out = append(out, kv)
	}
	return out
}

// under reports whether p is one of roots or below one.
func under(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return true
		}
	}
	return false
}

// topmost keeps the paths that are not below another of them, sorted.
func topmost(paths []string) []string {
	slices.Sort(paths)
	paths = slices.Compact(paths)
	var out []string
	for _, p := range paths {
		if !under(p, out) {
			out = append(out, p)
		}
	}
	return out
}

// binfmt is one binfmt_misc entry, as /proc/sys/fs/binfmt_misc/NAME
// shows it.
type binfmt struct {
	enabled                   bool
	interpreter, flags, magic string
}

// parseBinfmt reads an entry: "enabled" or "disabled", then "key value"
// lines (interpreter, flags:, offset, magic or extension).
func parseBinfmt(s string) binfmt {
	var e binfmt
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if i == 0 {
			e.enabled = line == "enabled"
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		v = strings.TrimSpace(v)
		switch strings.TrimSuffix(k, ":") {
		case "interpreter":
			e.interpreter = v
		case "flags":
			e.flags = v
		case "magic":
			e.magic = strings.ToLower(v)
		}
	}
	return e
}

func lstat(f func(string) (fs.FileMode, error), p string) (fs.FileMode, error) {
	if f == nil {
		return 0, fs.ErrNotExist
	}
	return f(p)
}

func isRegular(f func(string) (fs.FileMode, error), p string) bool {
	m, err := lstat(f, p)
	return err == nil && m.IsRegular()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
