package buildinfo

import (
	"runtime/debug"
	"strings"
)

// The link-time stamps (make and oac-release set them with -ldflags -X).
// Empty: the build's own information decides (Read).
var (
	// Version is the release (vX.Y.Z) or git description.
	Version string
	// Commit is the full commit hash the build was made from.
	Commit string
	// Modified is "true" when the tree had changes beyond Commit.
	Modified string
)

// Info is what a binary says it is.
type Info struct {
	// Version is the release, the module version `go install ...@vX.Y.Z`
	// built, the pseudo-version of a VCS build, or "dev".
	Version string
	// Commit is the commit hash, "" when the build does not know it (a
	// module download carries no VCS information).
	Commit string
	// Modified is true when the tree had uncommitted changes.
	Modified bool
}

// Read returns this binary's Info: the -X stamps, and for what they leave
// unset the build's own information (runtime/debug.ReadBuildInfo).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return From(Version, Commit, Modified, bi)
}

// From derives Info from the stamps and bi (nil: none). A stamp wins over
// bi; the main module's version counts only when it is a real one (not
// "(devel)", which a plain `go build` outside a VCS checkout reports).
func From(version, commit, modified string, bi *debug.BuildInfo) Info {
	var in Info
	vcsModified := ""
	if bi != nil {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.modified":
				vcsModified = s.Value
			}
		}
		// A module version built from a dirty tree says so itself
		// (vX.Y.Z+dirty) even where vcs.modified is absent.
		if strings.HasSuffix(in.Version, "+dirty") && vcsModified == "" {
			vcsModified = "true"
		}
	}
	if version != "" {
		in.Version = version
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	if commit != "" {
		in.Commit = commit
	}
	if modified != "" {
		vcsModified = modified
	}
	in.Modified = vcsModified == "true"
	return in
}
