package kit

import (
	"fmt"
	"os"
	"path/filepath"
)

// HostEntry is one top-level path of the default root: a directory bound
// read-only, or a symlink recreated (merged-/usr systems link /bin to
// usr/bin).
type HostEntry struct {
	Path    string
	Symlink string // the target when the host path is a symlink
}

// HostRoot lists the top-level host paths of the default root.
func HostRoot() []HostEntry {
	var out []HostEntry
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			if target, err := os.Readlink(p); err == nil {
				out = append(out, HostEntry{Path: p, Symlink: target})
			}
			continue
		}
		if st.IsDir() {
			out = append(out, HostEntry{Path: p})
		}
	}
	return out
}

// hostEtcFiles are the host /etc entries the default root shares
// read-only: TLS roots, the dynamic linker's cache, name service and time
// zone data.
var hostEtcFiles = []string{
	"ssl", "ca-certificates", "ca-certificates.conf", "alternatives",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf",
	"localtime", "timezone", "os-release", "protocols", "services", "mime.types",
}

// Passwd and Group list the identities every guest has.
func Passwd() string {
	return "root:x:0:0:root:/root:/bin/sh\n" +
		fmt.Sprintf("runtime:x:%d:%d:runtime:/home/runtime:/bin/sh\n", 1000, 1000) +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

// Group lists the groups every guest has.
func Group() string { return "root:x:0:\nruntime:x:1000:\nnogroup:x:65534:\n" }

// Hosts is the guest's /etc/hosts.
func Hosts(hostname string) string {
	s := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if hostname != "" {
		s += "127.0.1.1\t" + hostname + "\n"
	}
	return s
}

// EtcFiles writes the guest's passwd, group and hosts (and the extra
// files, name -> content) into dir and returns what the default root
// binds read-only under /etc, as guest path -> host path: those files
// and the host's shared /etc entries that exist.
func EtcFiles(dir, hostname string, extra map[string]string) ([][2]string, error) {
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	files := map[string]string{"passwd": Passwd(), "group": Group(), "hosts": Hosts(hostname)}
	for k, v := range extra {
		files[k] = v
	}
	var etc [][2]string
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		etc = append(etc, [2]string{"/etc/" + name, path})
	}
	for _, name := range hostEtcFiles {
		if _, err := os.Stat("/etc/" + name); err == nil {
			etc = append(etc, [2]string{"/etc/" + name, "/etc/" + name})
		}
	}
	return etc, nil
}
