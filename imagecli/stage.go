package imagecli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/manifest"
	"github.com/oac/sandbox-agent/stage"
)

const stageHelp = `usage: oac-image stage --store DIR --manifest FILE [--name NAME | --kind K --platform P --arch A]
       oac-image stage --store DIR --url URL [--mirror URL]... --size BYTES --sha256 HEX [--name NAME]

Downloads pinned artifacts into a content-addressed store, DIR/sha256/HEX, and
prints "NAME PATH" for each on stdout. A download is hashed while it streams;
its size and sha256 are checked before it is renamed into place, so the store
only ever holds verified files. An interrupted or truncated download is kept in
DIR/tmp and resumed by the next run (HTTP Range; the whole file is verified at
the end). Two runs staging the same file share one download.

An artifact's url is tried first, then its mirrors in order (the manifest's
"mirrors", or --mirror). A mirror that fails is named by its host (never more
of its URL) and the next one resumes what it kept with a Range request; bytes
from any mirror are accepted only if the whole file's sha256 is the pinned
one, so a mirror serving other bytes is named and nothing of it is kept.

With --manifest, every artifact matching the filters is staged (default: all).
Progress goes to stderr: a bar on a terminal, else one JSON event per line
({"event":"start"|"progress"|"wait"|"verify"|"repair"|"retry"|"mirror"|"done"|"error",...};
repair: a staged file was damaged and is staged again; mirror: "mirror" failed,
"next" is tried); --quiet prints nothing but errors and failed mirrors.

Exit status 0 when everything is staged; 1 on a failure, with one line saying
which: corrupt (sha256 mismatch, nothing kept), truncated (partial kept),
wrong size, HTTP error status, stalled (no data for --idle-timeout, partial
kept); when every mirror failed, the code is the last one's and the line names
each; 2 for usage errors.

Example:
  oac-image stage --store ~/.cache/oac/store --manifest manifest.json --platform linux --arch amd64
`

func stageCmd(args []string, env cli.Env) int {
	stdout, stderr := env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-image stage")
	store := fs.String("store", "", "the store directory (required)")
	mf := fs.String("manifest", "", "a pinned manifest to stage from")
	name := fs.String("name", "", "with --manifest: only this artifact; with --url: the label in events")
	kind := fs.String("kind", "", "with --manifest: only artifacts of this kind")
	platform := fs.String("platform", "", "with --manifest: only artifacts for this platform (darwin, linux, windows)")
	arch := fs.String("arch", "", "with --manifest: only artifacts for this arch (amd64, arm64)")
	u := fs.String("url", "", "a single file's URL (https; http only for loopback)")
	var mirrors urlsFlag
	fs.Var(&mirrors, "mirror", "with --url: another URL serving the same bytes, tried after it (repeatable, in order)")
	size := fs.Int64("size", 0, "with --url: its exact size in bytes")
	sum := fs.String("sha256", "", "with --url: its sha256 (64 lowercase hex digits)")
	idle := fs.Duration("idle-timeout", 30*time.Second, "fail a transfer that receives nothing for this long")
	quiet := fs.Bool("quiet", false, "no progress output")
	progress := fs.String("progress", "auto", "progress format: auto (bar on a terminal, else json), bar or json")
	asJSON := fs.Bool("json", false, "print what was staged as one JSON object on stdout (schema/image-stage.schema.json), a failure too, instead of NAME PATH lines")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	if len(args) > 0 || *store == "" || (*mf == "") == (*u == "") {
		fmt.Fprintln(stderr, "oac-image stage: --store and exactly one of --manifest or --url are required (see oac-image stage --help)")
		return 2
	}
	if len(mirrors) > 0 && *u == "" {
		fmt.Fprintln(stderr, "oac-image stage: --mirror goes with --url (a manifest lists its own mirrors)")
		return 2
	}
	var targets []stage.Target
	if *mf != "" {
		f, err := os.Open(*mf)
		if err != nil {
			fmt.Fprintf(stderr, "oac-image: %v\n", err)
			return 1
		}
		m, err := manifest.Decode(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "oac-image: %s: %v\n", *mf, err)
			return 1
		}
		for _, a := range m.Find(*name, *kind, *platform, *arch) {
			targets = append(targets, stage.FromArtifact(a))
		}
		if len(targets) == 0 {
			fmt.Fprintln(stderr, "oac-image: no artifact in the manifest matches the filters")
			return 1
		}
	} else {
		targets = []stage.Target{{Name: *name, URL: *u, Mirrors: []string(mirrors), Size: *size, SHA256: *sum}}
	}
	st := &stage.Stager{Store: *store, IdleTimeout: *idle}
	if !*quiet {
		mode := *progress
		if mode == "auto" {
			mode = "json"
			if f, ok := stderr.(*os.File); ok && stage.IsTerminal(f) {
				mode = "bar"
			}
		}
		switch mode {
		case "bar":
			st.Progress = stage.BarProgress(stderr)
		case "json":
			st.Progress = stage.JSONProgress(stderr)
		default:
			fmt.Fprintf(stderr, "oac-image stage: --progress %q: want auto, bar or json\n", *progress)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep := api.ImageStageReport{SchemaVersion: api.SchemaVersion, Staged: []api.StagedFile{}}
	for _, t := range targets {
		res, err := st.Stage(ctx, t)
		if err != nil {
			fmt.Fprintf(stderr, "oac-image: %s: %v\n", stage.Code(err), err)
			if *asJSON {
				rep.Error = &api.StageError{Name: t.Name, Code: string(stage.Code(err)), Message: err.Error()}
				cli.PrintJSON(stdout, rep)
			}
			return 1
		}
		label := t.Name
		if label == "" {
			label = t.SHA256
		}
		if res.Repaired != "" && *quiet {
			// Progress output said so already; quiet still does.
			fmt.Fprintf(stderr, "oac-image: %s: the staged file was damaged (%s): removed it and staged it again\n", label, res.Repaired)
		}
		if len(res.Failed) > 0 && *quiet {
			// A mirror that failed (or served other bytes) is said even
			// when another one served the file.
			for _, f := range res.Failed {
				fmt.Fprintf(stderr, "oac-image: %s: a mirror failed: %s\n", label, f)
			}
			fmt.Fprintf(stderr, "oac-image: %s: staged from mirror %s\n", label, res.Mirror)
		}
		if *asJSON {
			rep.Staged = append(rep.Staged, api.StagedFile{Name: t.Name, Path: res.Path, SHA256: t.SHA256, Size: t.Size,
				Cached: res.Cached, Downloaded: res.Downloaded, Mirror: res.Mirror, Repaired: res.Repaired,
				FailedMirrors: append([]string{}, res.Failed...)})
			continue
		}
		fmt.Fprintf(stdout, "%s %s\n", label, res.Path)
	}
	if *asJSON {
		cli.PrintJSON(stdout, rep)
	}
	return 0
}

// urlsFlag collects a repeated URL flag as given (a URL may hold a comma).
type urlsFlag []string

func (l *urlsFlag) String() string     { return strings.Join(*l, " ") }
func (l *urlsFlag) Set(v string) error { *l = append(*l, v); return nil }
