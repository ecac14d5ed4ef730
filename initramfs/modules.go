package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Limits on what the module reader accepts from a kernel tree.
const (
	maxModulesDep  = 16 << 20 // modules.dep
	maxModuleBytes = 64 << 20 // one decompressed .ko
	maxDepLine     = 1 << 20
)

// ModuleDeps is a parsed modules.dep: for each module file (relative to the
// modules directory, e.g. "kernel/drivers/char/virtio_console.ko"), the
// files it depends on, in the order depmod wrote them (a module's
// dependencies come before the modules they depend on, so loading walks the
// list backwards, as modprobe does).
type ModuleDeps struct {
	deps   map[string][]string
	byName map[string]string // normalised module name -> file
}

// ModuleName returns the name the kernel knows a module file by:
// "kernel/drivers/net/virtio_net.ko.xz" -> "virtio_net". Dashes and
// underscores are equivalent in module names; the result uses underscores.
func ModuleName(file string) string {
	base := path.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// ParseModulesDep parses a modules.dep document ("file: dep dep ...").
func ParseModulesDep(r io.Reader) (*ModuleDeps, error) {
	md := &ModuleDeps{deps: map[string][]string{}, byName: map[string]string{}}
	sc := bufio.NewScanner(io.LimitReader(r, maxModulesDep))
	sc.Buffer(make([]byte, 0, 64<<10), maxDepLine)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		file, rest, ok := strings.Cut(text, ":")
		file = strings.TrimSpace(file)
		if !ok || !validModulePath(file) {
			return nil, fmt.Errorf("modules.dep line %d: want \"path/module.ko: deps...\"", line)
		}
		deps := strings.Fields(rest)
		for _, d := range deps {
			if !validModulePath(d) {
				return nil, fmt.Errorf("modules.dep line %d: dependency is not a relative .ko path", line)
			}
		}
		if _, dup := md.deps[file]; dup {
			return nil, fmt.Errorf("modules.dep line %d: module listed twice", line)
		}
		md.deps[file] = deps
		name := ModuleName(file)
		if prev, dup := md.byName[name]; !dup || file < prev {
			md.byName[name] = file
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	return md, nil
}

// validModulePath accepts a clean relative path ending in .ko, .ko.xz,
// .ko.zst or .ko.gz: nothing that could leave the modules directory.
func validModulePath(p string) bool {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || strings.HasPrefix(p, "../") || p == ".." {
		return false
	}
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if strings.HasSuffix(p, ext) && len(p) > len(ext) {
			return true
		}
	}
	return false
}

// File returns the module file for a module name, or false.
func (md *ModuleDeps) File(name string) (string, bool) {
	f, ok := md.byName[strings.ReplaceAll(name, "-", "_")]
	return f, ok
}

// Resolve returns the module files needed to load names, each once, in an
// order in which every module comes after everything it depends on. Names
// the builtin set contains (modules.builtin, as names) are skipped: the
// kernel has them already. An unknown name is an error that says so.
func (md *ModuleDeps) Resolve(names []string, builtin map[string]bool) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(file string, chain []string) error
	visit = func(file string, chain []string) error {
		switch state[file] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("modules.dep has a dependency cycle: %s", strings.Join(append(chain, ModuleName(file)), " -> "))
		}
		deps, ok := md.deps[file]
		if !ok {
			return fmt.Errorf("modules.dep names %s as a dependency but does not list it", file)
		}
		state[file] = 1
		// depmod lists the deepest dependency last; walk backwards so the
		// order matches modprobe's where the graph allows a choice.
		for i := len(deps) - 1; i >= 0; i-- {
			if err := visit(deps[i], append(chain, ModuleName(file))); err != nil {
				return err
			}
		}
		state[file] = 2
		order = append(order, file)
		return nil
	}
	for _, n := range names {
		file, ok := md.File(n)
		if !ok {
			if builtin[strings.ReplaceAll(n, "-", "_")] {
				continue
			}
			return nil, fmt.Errorf("module %q is neither in modules.dep nor built into the kernel (check the name with: grep -w %s modules.dep)", n, strings.ReplaceAll(n, "-", "_"))
		}
		if err := visit(file, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// ParseBuiltin reads modules.builtin (one "kernel/.../name.ko" per line)
// into a set of module names.
func ParseBuiltin(r io.Reader) (map[string]bool, error) {
	set := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(r, maxModulesDep))
	sc.Buffer(make([]byte, 0, 64<<10), maxDepLine)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" && !strings.HasPrefix(t, "#") {
			set[ModuleName(t)] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.builtin: %w", err)
	}
	return set, nil
}

// LoadModuleTree reads dir/modules.dep and dir/modules.builtin (optional)
// of a kernel's modules directory (/lib/modules/VERSION).
func LoadModuleTree(dir string) (*ModuleDeps, map[string]bool, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, nil, fmt.Errorf("open modules.dep: %w (run depmod -b BASE VERSION on the kernel tree first; make kernel does)", err)
	}
	defer f.Close()
	md, err := ParseModulesDep(f)
	if err != nil {
		return nil, nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		defer b.Close()
		if builtin, err = ParseBuiltin(b); err != nil {
			return nil, nil, err
		}
	}
	return md, builtin, nil
}

// ReadModule reads a module file and returns it uncompressed, with the
// name it gets in the initramfs (".ko.xz", ".ko.zst" and ".ko.gz" become ".ko": the
// guest loads it with finit_module and no decompression support).
func ReadModule(dir, file string) (data []byte, outName string, err error) {
	if !validModulePath(file) {
		return nil, "", fmt.Errorf("module path %q is not a clean relative .ko path", file)
	}
	raw, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(file)))
	if err != nil {
		return nil, "", fmt.Errorf("read module: %w", err)
	}
	data, err = decompressModule(file, raw)
	if err != nil {
		return nil, "", err
	}
	return data, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(file, ".xz"), ".zst"), ".gz"), nil
}

func decompressModule(file string, raw []byte) ([]byte, error) {
	var r io.Reader
	switch {
	case strings.HasSuffix(file, ".ko"):
		return raw, nil
	case strings.HasSuffix(file, ".ko.xz"):
		xr, err := xz.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", file, err)
		}
		r = xr
	case strings.HasSuffix(file, ".ko.zst"):
		zr, err := zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderMaxMemory(maxModuleBytes), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", file, err)
		}
		defer zr.Close()
		r = zr
	case strings.HasSuffix(file, ".ko.gz"):
		gr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", file, err)
		}
		r = gr
	default:
		return nil, fmt.Errorf("module %s: unsupported compression (want .ko, .ko.xz, .ko.zst or .ko.gz)", file)
	}
	out, err := io.ReadAll(io.LimitReader(r, maxModuleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("decompress %s: %w", file, err)
	}
	if len(out) > maxModuleBytes {
		return nil, fmt.Errorf("decompress %s: larger than %d bytes", file, maxModuleBytes)
	}
	return out, nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
