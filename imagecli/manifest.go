package imagecli

import (
	"fmt"
	"os"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/manifest"
)

const manifestHelp = `usage: oac-image manifest verify MANIFEST [--store DIR] [--dir DIR]...

Checks a pinned manifest: strict JSON (schema 1, exactly the known keys, no
duplicates, no trailing data) and every rule (names, kinds, platforms, https
URLs, sizes, sha256). With --store or --dir it also checks the file of every
artifact: first STORE/sha256/HEX (what oac-image stage fills), then
DIR/NAME where NAME is the last element of the artifact's URL. Each artifact
gets one line: ok, missing, wrong size or sha256 mismatch. Exit status 0
when everything checks, 1 otherwise, 2 for usage errors.

Example:
  oac-image manifest verify out/manifest.json --dir out/
`

func manifestVerifyCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-image manifest verify")
	store := fs.String("store", "", "a staging store (STORE/sha256/HEX) to look for files in")
	var dirs listFlag
	fs.Var(&dirs, "dir", "a directory holding the files by their URL's last name (repeatable)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object (schema/image-verify.schema.json) instead of lines")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) != 1 {
		return cli.Usagef(fs, stderr, "want exactly one MANIFEST (see oac-image manifest verify --help)")
	}
	path := args[0]
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %v\n", err)
		return 1
	}
	m, err := manifest.Decode(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "oac-image: %s: %v\n", path, err)
		return 1
	}
	rep := api.ImageVerifyReport{SchemaVersion: api.SchemaVersion, Manifest: path, Schema: m.Schema, Release: m.Release, Artifacts: []api.VerifiedFile{}, AllOK: true}
	if !*asJSON {
		fmt.Fprintf(stdout, "manifest %s: schema %d, release %s, %d artifacts: valid\n", path, m.Schema, m.Release, len(m.Artifacts))
	}
	bad := 0
	for _, a := range m.Artifacts {
		if *store == "" && len(dirs) == 0 {
			break
		}
		p, err := manifest.Locate(a, *store, dirs)
		if err == nil {
			err = manifest.VerifyFile(a, p)
		}
		f := api.VerifiedFile{Name: a.Name, OK: err == nil, Path: p, Size: a.Size}
		if err != nil {
			bad++
			f.Error = err.Error()
			if !*asJSON {
				fmt.Fprintf(stdout, "%-32s FAIL %v\n", a.Name, err)
			}
		} else if !*asJSON {
			fmt.Fprintf(stdout, "%-32s ok   %s (%d bytes)\n", a.Name, p, a.Size)
		}
		rep.Artifacts = append(rep.Artifacts, f)
	}
	rep.AllOK = bad == 0
	if *asJSON {
		cli.PrintJSON(stdout, rep)
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "oac-image: %d of %d artifacts failed verification\n", bad, len(m.Artifacts))
		return 1
	}
	return 0
}
