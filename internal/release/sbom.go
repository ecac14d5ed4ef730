package release

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// CycloneDXModule is the tool module's main package; tools/sbom's go.mod
// pins its version (v1.10.0).
const CycloneDXModule = "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"

// BuildCycloneDX builds cyclonedx-gomod from toolsDir (tools/sbom) into
// out: from the Go module proxy, like every other module.
func BuildCycloneDX(ctx context.Context, goCmd, toolsDir, out string) error {
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-o", out, CycloneDXModule)
	cmd.Dir = toolsDir
	cmd.Env = append(Env(Target{GOOS: hostGOOS(ctx, goCmd), GOARCH: hostGOARCH(ctx, goCmd)}), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build cyclonedx-gomod in %s: %w (it comes from the Go module proxy: check GOPROXY)\n%s", toolsDir, err, b)
	}
	return nil
}

func goEnv(ctx context.Context, goCmd, key string) string {
	b, err := exec.CommandContext(ctx, goCmd, "env", key).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func hostGOOS(ctx context.Context, goCmd string) string   { return goEnv(ctx, goCmd, "GOHOSTOS") }
func hostGOARCH(ctx context.Context, goCmd string) string { return goEnv(ctx, goCmd, "GOHOSTARCH") }

// CycloneDX returns an Options.SBOM that runs cyclonedx-gomod (tool) on
// the module at moduleDir with each target's own build constraints (GOOS,
// GOARCH, no cgo, its tags), so each SBOM lists the modules linked into
// that binary. No serial number and no timestamp: the SBOM is as
// reproducible as the archive. moduleDir is Build's tagged copy of the
// source (taggedCopy), so the SBOM names the release version.
func CycloneDX(tool string) func(ctx context.Context, t Target, moduleDir, path string) error {
	return func(ctx context.Context, t Target, moduleDir, path string) error {
		p, ok := programs[t.Program]
		if !ok {
			return fmt.Errorf("no program %q", t.Program)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, tool, "app", "-json", "-noserial", "-notimestamp",
			"-main", strings.TrimPrefix(p.pkg, "./"), "-output", abs, ".")
		cmd.Dir = moduleDir
		cmd.Env = Env(t)
		if p.tags != "" {
			for i, kv := range cmd.Env {
				if strings.HasPrefix(kv, "GOFLAGS=") {
					cmd.Env[i] = kv + " -tags=" + p.tags
				}
			}
		}
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("cyclonedx-gomod: %w\n%s", err, stderr.Bytes())
		}
		return nil
	}
}

// skipped are the source tree's directories that no build reads.
var skipped = map[string]bool{".git": true, ".cache": true, "bin": true, "dist": true, "node_modules": true}

// taggedCopy copies the module at source into dir as a fresh git
// repository of one commit tagged version: cyclonedx-gomod reads the main
// module's version from the tag of HEAD (and cannot open a git worktree),
// so the SBOM says the release version and never depends on the
// builder's checkout.
func taggedCopy(ctx context.Context, source, dir, version string, when time.Time) error {
	if err := copyTree(source, dir); err != nil {
		return fmt.Errorf("copy the module for its SBOM: %w", err)
	}
	date := fmt.Sprintf("@%d +0000", when.Unix())
	// GIT_DIR and GIT_WORK_TREE pin every command to the copy.
	env := append(os.Environ(), "GIT_DIR="+filepath.Join(dir, ".git"), "GIT_WORK_TREE="+dir,
		"GIT_CEILING_DIRECTORIES="+filepath.Dir(dir), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=oac-release", "GIT_AUTHOR_EMAIL=release@oac.invalid", "GIT_AUTHOR_DATE="+date,
		"GIT_COMMITTER_NAME=oac-release", "GIT_COMMITTER_EMAIL=release@oac.invalid", "GIT_COMMITTER_DATE="+date)
	for _, args := range [][]string{
		{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "--no-verify", "-m", "release " + version}, {"tag", version},
	} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir, cmd.Env = dir, env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s for the SBOM's module copy: %w: %s", args[0], err, b)
		}
	}
	return nil
}

// copyTree copies the regular files of the source tree at source into dir,
// leaving out the directories no build reads (skipped).
func copyTree(source, dir string) error {
	err := filepath.WalkDir(source, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(source, path)
		if err != nil {
			return err
		}
		// .git is a file in a git worktree: skipped either way, so that no
		// git command below ever reaches the builder's repository.
		if skipped[d.Name()] && rel != "." {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	return err
}
