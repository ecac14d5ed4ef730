package vmparams

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"sync"
)

// Kernel command line parameters oac-guest reads as PID 1 of a VM.
const (
	// Transport selects the transport: serial:NAME (a virtio-serial port
	// with that name) or vsock:PORT (the host, CID 2) or vsock:CID:PORT.
	Transport = "oac.transport"
	// HostGrace is how long the guest waits for the host to come back
	// after the connection is gone (or to appear at boot) before it powers
	// off, as a Go duration ("30s").
	HostGrace = "oac.host_grace"
	// Debug set to 1 turns on debug logging.
	Debug = "oac.debug"
	// Root names the block device holding the image's root filesystem
	// ("vda"): the guest mounts it read-only (ext4 or erofs, told apart by
	// their superblocks), lays writable layers over what must be writable
	// and switches into it. Without it the guest runs from its initramfs.
	Root = "oac.root"
	// Shares lists virtio-fs shares to mount, comma-separated, each
	// TAG:PATH or TAG:PATH:ro ("workspace:/environment/workspace").
	Shares = "oac.shares"
	// Keep names the block device of a kept sandbox's disk ("vdb", or
	// "vda" when there is no root disk): an ext4 filesystem the host
	// made, on which the guest keeps its writable layers across runs.
	// With oac.root the whole root is an overlay whose upper layer is on
	// that disk; without it /home, /environment and /usr/local are.
	Keep = "oac.keep"
)

// KeepDevice returns the block device name of a kept sandbox's disk: the
// second virtio disk when there is a root disk, else the first.
func KeepDevice(root bool) string {
	if root {
		return "vdb"
	}
	return RootDevice
}

// RootDevice is the block device name of the first virtio disk, the one
// providers attach the root disk as.
const RootDevice = "vda"

// MaxShares bounds the shares one guest mounts.
const MaxShares = 16

// The patterns are compiled on first use: every guest and shim imports
// this package, and compiling them at start would cost each boot.
var (
	blockNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9]{0,31}$`) })
	// Virtualization.framework allows 36 bytes per tag.
	tagRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,35}$`) })
	pathRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(/[A-Za-z0-9._-]+)+$`) })
)

// ValidTag reports whether tag is a virtio-fs tag both sides accept: 1 to
// 36 of A-Z, a-z, 0-9, '.', '_' and '-'.
func ValidTag(tag string) bool { return tagRE().MatchString(tag) }

// ParseRoot checks the value of oac.root.
func ParseRoot(v string) (string, error) { return parseBlock(Root, v) }

// ParseKeep checks the value of oac.keep.
func ParseKeep(v string) (string, error) { return parseBlock(Keep, v) }

func parseBlock(param, v string) (string, error) {
	if !blockNameRE().MatchString(v) {
		return "", fmt.Errorf("%s: want a block device name such as %s", param, RootDevice)
	}
	return v, nil
}

// Share is one virtio-fs share the guest mounts.
type Share struct {
	// Tag is the virtio-fs tag the host gave the shared directory.
	Tag string
	// Path is where the guest mounts it.
	Path     string
	ReadOnly bool
}

// String returns the parameter form of one share.
func (s Share) String() string {
	if s.ReadOnly {
		return s.Tag + ":" + s.Path + ":ro"
	}
	return s.Tag + ":" + s.Path
}

// FormatShares returns the value of oac.shares for shares, checking each
// the way the guest will.
func FormatShares(shares []Share) (string, error) {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = s.String()
	}
	v := strings.Join(parts, ",")
	if _, err := ParseShares(v); err != nil {
		return "", err
	}
	return v, nil
}

// ParseShares parses the value of oac.shares. Paths are absolute and clean
// (letters, digits, '.', '_', '-'), never / or below /proc, /sys or /dev,
// each mounted once.
func ParseShares(v string) ([]Share, error) {
	if v == "" {
		return nil, nil
	}
	items := strings.Split(v, ",")
	if len(items) > MaxShares {
		return nil, fmt.Errorf("%s: at most %d shares", Shares, MaxShares)
	}
	var out []Share
	seen := map[string]bool{}
	for _, item := range items {
		f := strings.Split(item, ":")
		if len(f) < 2 || len(f) > 3 || (len(f) == 3 && f[2] != "ro") {
			return nil, fmt.Errorf("%s: want TAG:PATH or TAG:PATH:ro, comma-separated", Shares)
		}
		s := Share{Tag: f[0], Path: f[1], ReadOnly: len(f) == 3}
		if !ValidTag(s.Tag) {
			return nil, fmt.Errorf("%s: a tag is 1 to 36 of A-Z, a-z, 0-9, '.', '_' and '-'", Shares)
		}
		if !pathRE().MatchString(s.Path) || len(s.Path) > 256 || path.Clean(s.Path) != s.Path {
			return nil, fmt.Errorf("%s: share %s: the path must be absolute and clean (letters, digits, '.', '_', '-'), at most 256 bytes", Shares, s.Tag)
		}
		for _, sys := range []string{"/proc", "/sys", "/dev"} {
			if s.Path == sys || strings.HasPrefix(s.Path, sys+"/") {
				return nil, fmt.Errorf("%s: share %s: not below %s", Shares, s.Tag, sys)
			}
		}
		if seen[s.Path] {
			return nil, fmt.Errorf("%s: %s is mounted twice", Shares, s.Path)
		}
		seen[s.Path] = true
		out = append(out, s)
	}
	return out, nil
}
