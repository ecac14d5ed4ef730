package imagecli

import (
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/initramfs"
)

const usage = `usage:
  oac-image build --agent PATH --sandbox-io PATH [--base DIR|TAR] [--output KIND...] -o DIR
                      guest images: dir, tar (WSL), oci, e2b, ext4, erofs, vm (kernel+initramfs);
                      on Linux and macOS build hosts (stage and manifest verify run everywhere)
  oac-image initramfs --agent PATH [--kernel-modules DIR --module NAME...]
                      [--file SRC:DST[:MODE]...] -o FILE
  oac-image list FILE
  oac-image manifest verify MANIFEST [--store DIR] [--dir DIR]...
  oac-image stage --store DIR --manifest FILE [filters] | --url URL --size N --sha256 HEX

Run oac-image COMMAND --help for what each command does, with an example.
`

// Main runs oac-image with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "build":
		return buildImageCmd(args[1:], stdout, stderr)
	case "manifest":
		return manifestCmd(args[1:], stdout, stderr)
	case "stage":
		return stageCmd(args[1:], stdout, stderr)
	case "initramfs":
		return buildCmd(args[1:], stderr)
	case "list":
		return listCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "oac-image: unknown command %q\n%s", args[0], usage)
	return 2
}

// listFlag collects a repeated flag; each value may also be a comma list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// fileFlag collects --file SRC:DST[:MODE].
type fileFlag []initramfs.File

func (f *fileFlag) String() string { return fmt.Sprint(len(*f), " files") }
func (f *fileFlag) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return fmt.Errorf("want SRC:DST or SRC:DST:MODE (octal), e.g. bin/daemon:/usr/bin/daemon:0755")
	}
	file := initramfs.File{Src: parts[0], Dst: parts[1]}
	if len(parts) == 3 {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil || m > 0o777 || m == 0 {
			return fmt.Errorf("mode %q: want octal permission bits such as 0755", parts[2])
		}
		file.Mode = fs.FileMode(m)
	}
	*f = append(*f, file)
	return nil
}

func buildCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("oac-image initramfs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agent := fs.String("agent", "", "static oac-guest binary, becomes /init (required)")
	modDir := fs.String("kernel-modules", "", "kernel modules directory with modules.dep (e.g. .cache/kernel/modules)")
	var modules listFlag
	fs.Var(&modules, "module", "module to load at boot, with its dependencies (repeatable or comma-separated; default with --kernel-modules: "+strings.Join(initramfs.DefaultModules, ",")+")")
	var files fileFlag
	fs.Var(&files, "file", "extra file SRC:DST[:MODE] (repeatable)")
	out := fs.String("o", "", "output file (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *agent == "" || *out == "" {
		fmt.Fprint(stderr, "oac-image initramfs: --agent and -o are required and no other arguments are taken\n", usage)
		return 2
	}
	if len(modules) == 0 && *modDir != "" {
		modules = initramfs.DefaultModules
	}
	spec := initramfs.Spec{Agent: *agent, ModulesDir: *modDir, Modules: modules, Files: files}
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %v\n", err)
		return 1
	}
	defer os.Remove(tmp.Name())
	sum, err := initramfs.Build(spec, tmp)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), *out)
	}
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: build %s: %v\n", *out, err)
		return 1
	}
	st, _ := os.Stat(*out)
	fmt.Fprintf(stderr, "oac-image: wrote %s (%d bytes, %d entries, %d modules)\n", *out, st.Size(), sum.Entries, len(sum.Modules))
	return 0
}

func listCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	f, err := os.Open(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %v\n", err)
		return 1
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %s: %v (want a gzip-compressed newc archive)\n", args[0], err)
		return 1
	}
	entries, err := initramfs.ReadCpio(zr, 1<<30)
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %s: %v\n", args[0], err)
		return 1
	}
	for _, e := range entries {
		extra := ""
		if e.Mode&os.ModeDevice != 0 {
			extra = fmt.Sprintf(" %d:%d", e.RdevMajor, e.RdevMinor)
		}
		fmt.Fprintf(stdout, "%s %5d:%-5d %9d /%s%s\n", e.Mode, e.UID, e.GID, len(e.Data), strings.TrimPrefix(e.Name, "."), extra)
	}
	return 0
}
