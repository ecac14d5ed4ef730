package release

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Source is what a release says of its tree: the commit, its time and
// whether the tree has changes beyond it.
type Source struct {
	Commit   string
	Time     time.Time
	Modified bool
}

// GitSource reads Source from the git checkout at dir. Untracked files
// count as changes only when git would show them (dist/ and bin/ are
// ignored).
func GitSource(ctx context.Context, dir string) (Source, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s in %s: %w (a release is built from a git checkout; else pass the commit and its time)", strings.Join(args, " "), dir, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var s Source
	var err error
	if s.Commit, err = git("rev-parse", "HEAD"); err != nil {
		return s, err
	}
	ct, err := git("log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return s, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return s, fmt.Errorf("commit time %q: %w", ct, err)
	}
	s.Time = time.Unix(sec, 0).UTC()
	status, err := git("status", "--porcelain")
	if err != nil {
		return s, err
	}
	s.Modified = status != ""
	return s, nil
}
