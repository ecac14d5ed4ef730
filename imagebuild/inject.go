package imagebuild

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/protocol"
)

// Paths and identities every guest image has. They are contract: oac-shim,
// the providers and oac-sandbox-io rely on them.
const (
	AgentPath     = "/sbin/oac-guest"
	SandboxIOPath = "/usr/local/bin/oac-sandbox-io"
	CABundlePath  = "/etc/ssl/certs/ca-certificates.crt"
	RuntimeUser   = "runtime"
	RuntimeUID    = 1000
	RuntimeGID    = 1000
	RuntimeHome   = "/home/runtime"
	Workspace     = "/environment/workspace"
	// DefaultCABundle is the host's bundle on Debian and Ubuntu.
	DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// ExtraFile is a host file copied into the image.
type ExtraFile struct {
	Src string
	// Dst is the absolute path in the image.
	Dst string
	// Mode is the permission bits; 0 picks 0755 when Src has an execute
	// bit, else 0644.
	Mode fs.FileMode
}

// Injection is what the builder adds to a base rootfs.
type Injection struct {
	// Agent is the static oac-guest binary; it becomes /sbin/oac-guest.
	Agent string
	// SandboxIO is the oac-sandbox-io binary; it becomes
	// /usr/local/bin/oac-sandbox-io.
	SandboxIO string
	// CABundle is a PEM bundle; it becomes
	// /etc/ssl/certs/ca-certificates.crt.
	CABundle string
	// Files are further files (a daemon, configuration).
	Files []ExtraFile
	// AllRoot makes every base entry owned by 0:0 (the injected runtime
	// home and workspace stay 1000:1000).
	AllRoot bool
}

// Inject adds the guest's fixed parts to t: the agent, oac-sandbox-io, the
// CA bundle, the runtime user and group 1000 (merged into the base's
// /etc/passwd, /etc/group and, when present, shadow files), /home/runtime
// (0700, 1000:1000), /environment/workspace (0755, 1000:1000), the
// mount points the runtimes need (/proc, /sys, /dev, /run, /tmp) and
// /etc/wsl.conf (WSLConf).
func Inject(t *Tree, in Injection) error {
	if in.AllRoot {
		for _, n := range t.nodes {
			n.UID, n.GID = 0, 0
		}
	}
	if in.Agent == "" {
		return fmt.Errorf("no agent: pass the static oac-guest binary (make build puts it in bin/)")
	}
	if in.SandboxIO == "" {
		return fmt.Errorf("no oac-sandbox-io binary given: every guest image carries it at %s", SandboxIOPath)
	}
	if in.CABundle == "" {
		in.CABundle = DefaultCABundle
	}
	files := []ExtraFile{
		{Src: in.Agent, Dst: AgentPath, Mode: 0o755},
		{Src: in.SandboxIO, Dst: SandboxIOPath, Mode: 0o755},
		{Src: in.CABundle, Dst: CABundlePath, Mode: 0o644},
	}
	files = append(files, in.Files...)
	for _, f := range files {
		if err := putHostFile(t, f); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		path     string
		mode     fs.FileMode
		uid, gid int
		replace  bool
	}{
		{"proc", 0o555, 0, 0, false},
		{"sys", 0o555, 0, 0, false},
		{"dev", 0o755, 0, 0, false},
		{"run", 0o755, 0, 0, false},
		{"tmp", 0o777 | fs.ModeSticky, 0, 0, false},
		{"home", 0o755, 0, 0, false},
		{"etc", 0o755, 0, 0, false},
		{strings.TrimPrefix(RuntimeHome, "/"), 0o700, RuntimeUID, RuntimeGID, true},
		{"environment", 0o755, 0, 0, true},
		{strings.TrimPrefix(Workspace, "/"), 0o755, RuntimeUID, RuntimeGID, true},
	} {
		r, err := t.Resolve(d.path, true)
		if err != nil {
			return err
		}
		if n := t.nodes[r]; n != nil && n.Mode.IsDir() {
			if d.replace {
				n.Mode, n.UID, n.GID = fs.ModeDir|d.mode, d.uid, d.gid
			}
			continue
		}
		if _, err := t.Put(Node{Path: d.path, Mode: fs.ModeDir | d.mode, UID: d.uid, GID: d.gid}); err != nil {
			return fmt.Errorf("/%s: %w", d.path, err)
		}
	}
	removed, err := mergeDB(t, "etc/passwd", 0o644, func(base string) (string, []string) { return MergePasswd(base) })
	if err != nil {
		return err
	}
	if _, err := mergeDB(t, "etc/group", 0o644, func(base string) (string, []string) { return MergeGroup(base) }); err != nil {
		return err
	}
	for _, db := range []struct{ path, line string }{
		{"etc/shadow", RuntimeUser + ":!:1::::::"},
		{"etc/gshadow", RuntimeUser + ":!::"},
	} {
		r, err := t.Resolve(db.path, true)
		if err != nil {
			return err
		}
		if t.nodes[r] == nil {
			continue
		}
		line := db.line
		if _, err := mergeDB(t, db.path, 0, func(base string) (string, []string) {
			return mergeShadow(base, append(removed, RuntimeUser), line), nil
		}); err != nil {
			return err
		}
	}
	// A VM's root is read-only: the agent can bind its resolver's
	// resolv.conf over an existing file but not create one.
	for _, f := range []struct{ path, content string }{{"etc/hosts", defaultHosts}, {"etc/resolv.conf", protocol.ResolvConf}} {
		r, err := t.Resolve(f.path, true)
		if err != nil {
			return err
		}
		if t.nodes[r] == nil {
			if _, err := t.Put(Node{Path: f.path, Mode: 0o644, Data: []byte(f.content), Size: int64(len(f.content))}); err != nil {
				return err
			}
		}
	}
	// The image's own wsl.conf wins over a base's: it closes the doors a
	// WSL distribution has open by default.
	if _, err := t.Put(Node{Path: "etc/wsl.conf", Mode: 0o644, Data: []byte(WSLConf), Size: int64(len(WSLConf))}); err != nil {
		return fmt.Errorf("/etc/wsl.conf: %w", err)
	}
	return nil
}

// WSLConf is every image's /etc/wsl.conf: WSL reads it when it starts the
// distribution and then mounts no Windows drive, registers no interop
// handler, appends no Windows PATH and gives no GPU. A user or an older
// WSL can ignore it, so the agent checks again at every boot (package
// guest/doors; docs/platform-doors.md says which WSL honours what).
const WSLConf = `# oac guest image: no door to the Windows host (docs/platform-doors.md).
# oac-guest checks again at every boot and closes what is still open.
[automount]
enabled=false
mountFsTab=false

[interop]
enabled=false
appendWindowsPath=false

[gpu]
enabled=false
`

const defaultHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

func putHostFile(t *Tree, f ExtraFile) error {
	if !strings.HasPrefix(f.Dst, "/") || f.Dst == "/" {
		return fmt.Errorf("destination %q must be an absolute path below /", f.Dst)
	}
	st, err := os.Stat(f.Src)
	if err != nil {
		return fmt.Errorf("file for %s: %w", f.Dst, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("file for %s: %s is not a regular file", f.Dst, f.Src)
	}
	mode := f.Mode.Perm()
	if mode == 0 {
		mode = 0o644
		if st.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
	}
	// Contents are read when outputs are written; the size is checked
	// then, so a file that changes during the build is an error.
	if _, err := t.Put(Node{Path: strings.TrimPrefix(f.Dst, "/"), Mode: mode, Src: f.Src, Size: st.Size()}); err != nil {
		return fmt.Errorf("%s: %w", f.Dst, err)
	}
	return nil
}

// mergeDB rewrites a text database of the image through merge. The base's
// mode and owner are kept; a missing file gets mode (0 skips it).
func mergeDB(t *Tree, p string, mode fs.FileMode, merge func(string) (string, []string)) ([]string, error) {
	r, err := t.Resolve(p, true)
	if err != nil {
		return nil, err
	}
	var base string
	uid, gid := 0, 0
	if n := t.nodes[r]; n != nil {
		if !n.IsReg() {
			return nil, fmt.Errorf("/%s in the base is not a regular file", r)
		}
		b, err := readNode(t, n, 1<<20)
		if err != nil {
			return nil, err
		}
		base, mode, uid, gid = string(b), n.Mode.Perm(), n.UID, n.GID
	} else if mode == 0 {
		return nil, nil
	}
	out, removed := merge(base)
	if _, err := t.Put(Node{Path: r, Mode: mode, UID: uid, GID: gid, Data: []byte(out), Size: int64(len(out))}); err != nil {
		return nil, err
	}
	return removed, nil
}

// readNode returns a regular file's content (at most limit bytes).
func readNode(t *Tree, n *Node, limit int64) ([]byte, error) {
	if n.HardLink != "" {
		n = t.nodes[n.HardLink]
	}
	if n.Size > limit {
		return nil, fmt.Errorf("/%s is larger than %d bytes", n.Path, limit)
	}
	if n.Src == "" {
		return n.Data, nil
	}
	f, err := os.Open(n.Src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// MergePasswd returns base with the runtime user (1000:1000, home
// /home/runtime) as its only user named runtime or of uid 1000, and a root
// user; it also returns the names of the users it removed.
func MergePasswd(base string) (string, []string) {
	runtime := fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/sh", RuntimeUser, RuntimeUID, RuntimeGID, RuntimeUser, RuntimeHome)
	return mergeIDs(base, "root:x:0:0:root:/root:/bin/sh", runtime, RuntimeUID)
}

// MergeGroup does for /etc/group what MergePasswd does for /etc/passwd.
func MergeGroup(base string) (string, []string) {
	return mergeIDs(base, "root:x:0:", fmt.Sprintf("%s:x:%d:", RuntimeUser, RuntimeGID), RuntimeGID)
}

func mergeIDs(base, rootLine, line string, id int) (string, []string) {
	var out []string
	var removed []string
	hasRoot := false
	for _, l := range strings.Split(base, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		f := strings.Split(l, ":")
		if len(f) >= 3 && (f[0] == RuntimeUser || f[2] == strconv.Itoa(id)) {
			if f[0] != RuntimeUser {
				removed = append(removed, f[0])
			}
			continue
		}
		if f[0] == "root" {
			hasRoot = true
		}
		out = append(out, l)
	}
	if !hasRoot {
		out = append([]string{rootLine}, out...)
	}
	out = append(out, line)
	return strings.Join(out, "\n") + "\n", removed
}

func mergeShadow(base string, drop []string, line string) string {
	var out []string
	for _, l := range strings.Split(base, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		name, _, _ := strings.Cut(l, ":")
		skip := false
		for _, d := range drop {
			if name == d {
				skip = true
			}
		}
		if !skip {
			out = append(out, l)
		}
	}
	out = append(out, line)
	return strings.Join(out, "\n") + "\n"
}
