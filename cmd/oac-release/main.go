// Command oac-release builds the release artifacts (package release) into
// -out: `make release VERSION=vX.Y.Z` runs it. The commit, its time and
// whether the tree is modified come from git unless given.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/internal/release"
)

func main() {
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	fs := cli.FlagSet("oac-release")
	version := fs.String("version", "", "the release version, vX.Y.Z (required)")
	out := fs.String("out", "dist", "the directory written (must not exist or be empty)")
	only := fs.String("only", "", "comma-separated PROGRAM/GOOS/GOARCH targets to build (default: every target)")
	commit := fs.String("commit", "", "the commit hash stamped (default: git rev-parse HEAD)")
	commitTime := fs.Int64("commit-time", 0, "the archive entries' time, Unix seconds (default: the commit's time)")
	modified := fs.String("modified", "", "true or false: the tree has changes beyond the commit (default: git status)")
	sbomTool := fs.String("cyclonedx-gomod", "", "path to cyclonedx-gomod: write an SBOM beside each archive")
	if args, code, ok := cli.Parse(fs, os.Args[1:], env); !ok || len(args) > 0 {
		if ok {
			code = cli.Usagef(fs, os.Stderr, "takes no arguments, not %q", args)
		}
		os.Exit(code)
	}
	if err := run(*version, *out, *only, *commit, *commitTime, *modified, *sbomTool); err != nil {
		fmt.Fprintln(os.Stderr, "oac-release:", err)
		os.Exit(1)
	}
}

func run(version, out, only, commit string, commitTime int64, modified, sbomTool string) error {
	ctx := context.Background()
	o := release.Options{Version: version, Out: out, Source: ".", Log: os.Stderr}
	if commit == "" || commitTime == 0 || modified == "" {
		src, err := release.GitSource(ctx, ".")
		if err != nil {
			return err
		}
		o.Commit, o.Time, o.Modified = src.Commit, src.Time, src.Modified
	}
	if commit != "" {
		o.Commit = commit
	}
	if commitTime != 0 {
		o.Time = time.Unix(commitTime, 0).UTC()
	}
	switch modified {
	case "":
	case "true", "false":
		o.Modified = modified == "true"
	default:
		return fmt.Errorf("-modified %q: give true or false", modified)
	}
	if only != "" {
		for _, s := range strings.Split(only, ",") {
			t, err := release.ParseTarget(s)
			if err != nil {
				return err
			}
			o.Targets = append(o.Targets, t)
		}
	}
	if sbomTool != "" {
		o.SBOM = release.CycloneDX(sbomTool)
	}
	return release.Build(ctx, o)
}
