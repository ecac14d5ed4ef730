//go:build unix

package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// hostEtc is the host's /etc (tests point it elsewhere).
var hostEtc = "/etc"

// etcPruneAge is how old another prepared /etc must be before a new one
// removes it (a sandbox starting at that moment may still bind it).
const etcPruneAge = 10 * time.Minute

// PreparedEtc returns a directory for the default root to bind read-only
// as the guest's whole /etc: one bind instead of one per file, each of
// which costs the runtime's setup (18 binds measured 0.7-1.5 ms of bwrap's
// 4.4 ms). It holds the guest's passwd and group, a hosts without a
// hostname (bind Hosts over it for one), the extra files (name -> content)
// and copies of the host's shared /etc entries (hostEtcFiles): regular
// files and directories readable by others, symlinks as they are;
// anything else, and anything only root may read (/etc/ssl/private), is
// left out. It is built once under cacheDir for each content (named by a
// fingerprint of the host's entries: names, sizes, modes and times of what
// is copied) and shared by every sandbox; an older one is removed when a
// newer one is built.
func PreparedEtc(cacheDir string, extra map[string]string) (string, error) {
	files := map[string]string{"passwd": Passwd(), "group": Group(), "hosts": Hosts("")}
	for k, v := range extra {
		files[k] = v
	}
	filesSum := sumFiles(files)
	if dir, ok := currentEtc(cacheDir, filesSum); ok {
		return dir, nil
	}
	fp, seen, err := etcFingerprint(filesSum)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, fp)
	defer func() { writeCurrentEtc(cacheDir, fp, filesSum, seen) }()
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("prepared /etc: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, "tmp-")
	if err != nil {
		return "", fmt.Errorf("prepared /etc: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("prepared /etc: %w", err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil {
			return "", fmt.Errorf("prepared /etc: %w", err)
		}
	}
	for _, name := range hostEtcFiles {
		if err := copyShared(filepath.Join(hostEtc, name), filepath.Join(tmp, name)); err != nil {
			return "", fmt.Errorf("prepared /etc: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if st, serr := os.Stat(dir); serr == nil && st.IsDir() {
			return dir, nil // another shim built the same one
		}
		return "", fmt.Errorf("prepared /etc: %w", err)
	}
	pruneEtc(cacheDir, fp)
	return dir, nil
}

// shared reports whether an entry of mode m is copied: a regular file
// others may read, a directory others may read and search, a symlink.
func shared(m fs.FileMode) bool {
	switch {
	case m&fs.ModeSymlink != 0:
		return true
	case m.IsDir():
		return m.Perm()&0o005 == 0o005
	case m.IsRegular():
		return m.Perm()&0o004 != 0
	}
	return false
}

// copyShared copies src to dst by the rules of shared; a missing src is
// nothing to copy.
func copyShared(src, dst string) error {
	st, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !shared(st.Mode()) {
		return err
	}
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case st.IsDir():
		if err := os.Mkdir(dst, st.Mode().Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := copyShared(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return os.Chmod(dst, st.Mode().Perm())
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sumFiles hashes the generated files.
func sumFiles(files map[string]string) string {
	h := sha256.New()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(h, "file %s %d %s\n", n, len(files[n]), files[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// statSig is what the fingerprint knows of one file or directory: a
// change to it (written, renamed over, an entry added or removed in a
// directory) changes its signature.
func statSig(st fs.FileInfo) string {
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	return fmt.Sprintf("%v %d %d %d", st.Mode(), st.Size(), st.ModTime().UnixNano(), ino)
}

// etcFingerprint names the prepared /etc for the generated files and the
// host's shared entries as they are now: what would be copied, by name,
// size, mode, inode and modification time (a changed CA bundle, a new
// certificate link, a rebuilt ld.so.cache all change it). It returns the
// paths it stat'ed with their signatures: while none of them changed, no
// entry was added, removed, renamed or written (a directory's time changes
// with its entries), so the next check stats only those (currentEtc)
// instead of reading every directory again (700 entries on Debian: half
// a millisecond per boot).
func etcFingerprint(filesSum string) (string, [][2]string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "files %s\n", filesSum)
	var seen [][2]string
	var walk func(p string) error
	walk = func(p string) error {
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			seen = append(seen, [2]string{p, "absent"})
			return nil
		}
		if err != nil {
			return err
		}
		m := st.Mode()
		sig := statSig(st)
		seen = append(seen, [2]string{p, sig})
		if !shared(m) {
			return nil
		}
		fmt.Fprintf(h, "%s %s\n", p, sig)
		if !m.IsDir() {
			return nil
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range ents {
			// A symlink is named by its entry; reading its target is what
			// copying it does, and replacing it changes the directory.
			if e.Type()&fs.ModeSymlink != 0 {
				fmt.Fprintf(h, "%s link\n", filepath.Join(p, e.Name()))
				continue
			}
			if err := walk(filepath.Join(p, e.Name())); err != nil {
				return err
			}
		}
		return nil
	}
	for _, name := range hostEtcFiles {
		if err := walk(filepath.Join(hostEtc, name)); err != nil {
			return "", nil, fmt.Errorf("prepared /etc: %w", err)
		}
	}
	return "etc-" + hex.EncodeToString(h.Sum(nil))[:32], seen, nil
}

// currentFile records the prepared /etc last built or checked and what
// its fingerprint saw.
const currentFile = "current"

// currentEtc returns the recorded prepared /etc when the generated files
// are the same and nothing it saw changed.
func currentEtc(cacheDir, filesSum string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(cacheDir, currentFile))
	if err != nil {
		return "", false
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	head := strings.Fields(lines[0])
	if len(head) != 2 || head[1] != filesSum || !strings.HasPrefix(head[0], "etc-") || strings.ContainsRune(head[0], '/') {
		return "", false
	}
	for _, l := range lines[1:] {
		p, sig, ok := strings.Cut(l, "\t")
		if !ok {
			return "", false
		}
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if sig != "absent" {
				return "", false
			}
		case err != nil || statSig(st) != sig:
			return "", false
		}
	}
	dir := filepath.Join(cacheDir, head[0])
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", false
	}
	return dir, true
}

// writeCurrentEtc records fp and what its fingerprint saw (best effort).
func writeCurrentEtc(cacheDir, fp, filesSum string, seen [][2]string) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", fp, filesSum)
	for _, s := range seen {
		fmt.Fprintf(&b, "%s\t%s\n", s[0], s[1])
	}
	f, err := os.CreateTemp(cacheDir, "tmp-")
	if err != nil {
		return
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(cacheDir, currentFile))
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

// pruneEtc removes other prepared /etc directories and interrupted builds
// older than etcPruneAge (best effort).
func pruneEtc(cacheDir, keep string) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Name() == keep || !(strings.HasPrefix(e.Name(), "etc-") || strings.HasPrefix(e.Name(), "tmp-")) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > etcPruneAge {
			_ = os.RemoveAll(filepath.Join(cacheDir, e.Name()))
		}
	}
}
