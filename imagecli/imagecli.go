package imagecli

import (
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/initramfs"
	"github.com/oac/sandbox-agent/internal/cli"
)

// commands is oac-image's command table: help and the completion
// scripts are generated from it and from each command's own flags.
func commands() []*cli.Command {
	return []*cli.Command{
		{Name: "build", Summary: "guest images: dir, tar (WSL), oci, e2b, ext4, erofs, vm (on Linux and macOS build hosts)", Help: buildHelp, Run: buildImageCmd},
		{Name: "initramfs", Summary: "an initramfs with oac-guest as /init and the modules a VM loads", Run: initramfsCmd},
		{Name: "list", Args: "FILE", Summary: "the members of a gzip-compressed newc initramfs", Run: listCmd},
		{Name: "manifest", Summary: "pinned manifests of artifacts", Help: "Example:\n  oac-image manifest verify out/manifest.json --dir out/\n", Sub: []*cli.Command{
			{Name: "verify", Args: "MANIFEST", Summary: "check a manifest and, with --store or --dir, the file of every artifact", Help: manifestHelp, Run: manifestVerifyCmd},
		}},
		{Name: "stage", Summary: "download pinned artifacts into a content-addressed store, verified", Help: stageHelp, Run: stageCmd},
	}
}

// Main runs oac-image with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	p := &cli.Program{Name: "oac-image", Commands: commands(), Help: "Each command's --help says what it does, with an example.\n"}
	return p.Main(args, cli.Env{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr})
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

func initramfsCmd(args []string, env cli.Env) int {
	stderr := env.Stderr
	fs := cli.FlagSet("oac-image initramfs")
	agent := fs.String("agent", "", "static oac-guest binary, becomes /init (required)")
	modDir := fs.String("kernel-modules", "", "kernel modules directory with modules.dep (e.g. .cache/kernel/modules)")
	var modules listFlag
	fs.Var(&modules, "module", "module to load at boot, with its dependencies (repeatable or comma-separated; default with --kernel-modules: "+strings.Join(initramfs.DefaultModules, ",")+")")
	var files fileFlag
	fs.Var(&files, "file", "extra file SRC:DST[:MODE] (repeatable)")
	out := fs.String("o", "", "output file (required)")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) > 0 || *agent == "" || *out == "" {
		return cli.Usagef(fs, stderr, "--agent and -o are required and no other arguments are taken (see oac-image initramfs --help)")
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

func listCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-image list")
	asJSON := fs.Bool("json", false, "print the members as one JSON object (schema/image-list.schema.json)")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) != 1 {
		return cli.Usagef(fs, stderr, "want one FILE, an initramfs (see oac-image list --help)")
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
	rep := api.ImageListReport{SchemaVersion: api.SchemaVersion, Entries: []api.ImageListEntry{}}
	for _, e := range entries {
		extra := ""
		if e.Mode&os.ModeDevice != 0 {
			extra = fmt.Sprintf(" %d:%d", e.RdevMajor, e.RdevMinor)
		}
		if *asJSON {
			rep.Entries = append(rep.Entries, api.ImageListEntry{Path: "/" + strings.TrimPrefix(e.Name, "."), Mode: e.Mode.String(),
				UID: e.UID, GID: e.GID, Size: int64(len(e.Data)), Device: strings.TrimSpace(extra)})
			continue
		}
		fmt.Fprintf(stdout, "%s %5d:%-5d %9d /%s%s\n", e.Mode, e.UID, e.GID, len(e.Data), strings.TrimPrefix(e.Name, "."), extra)
	}
	if *asJSON {
		cli.PrintJSON(stdout, rep)
	}
	return 0
}
