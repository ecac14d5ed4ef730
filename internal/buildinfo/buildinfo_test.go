package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func vcsBuild(version, rev, modified string) *debug.BuildInfo {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/oac/sandbox-agent", Version: version}}
	if rev != "" {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs", Value: "git"}, debug.BuildSetting{Key: "vcs.revision", Value: rev})
	}
	if modified != "" {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
	}
	return bi
}

const rev = "f6390a6e0f4c8b3e0e1d7a2b3c4d5e6f70819283"

func TestFrom(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		version, commit, modified string
		bi                        *debug.BuildInfo
		want                      Info
	}{
		{"go install of a tagged module: its version, no VCS information",
			"", "", "", vcsBuild("v1.2.3", "", ""), Info{Version: "v1.2.3"}},
		{"go build in a clean checkout: the pseudo-version and the commit",
			"", "", "", vcsBuild("v0.0.0-20261207203813-f6390a6e0f4c", rev, "false"),
			Info{Version: "v0.0.0-20261207203813-f6390a6e0f4c", Commit: rev}},
		{"go build in a dirty checkout",
			"", "", "", vcsBuild("v0.0.0-20261207203813-f6390a6e0f4c+dirty", rev, "true"),
			Info{Version: "v0.0.0-20261207203813-f6390a6e0f4c+dirty", Commit: rev, Modified: true}},
		{"a +dirty module version alone still says modified",
			"", "", "", vcsBuild("v1.2.4-0.20261207203813-f6390a6e0f4c+dirty", "", ""),
			Info{Version: "v1.2.4-0.20261207203813-f6390a6e0f4c+dirty", Modified: true}},
		{"go build outside a checkout: dev",
			"", "", "", vcsBuild("(devel)", "", ""), Info{Version: "dev"}},
		{"no build information at all: dev",
			"", "", "", nil, Info{Version: "dev"}},
		{"make's stamp wins over the module version, the commit comes from VCS",
			"v0.3.0-2-gf6390a6", "", "", vcsBuild("v0.0.0-20261207203813-f6390a6e0f4c+dirty", rev, "true"),
			Info{Version: "v0.3.0-2-gf6390a6", Commit: rev, Modified: true}},
		{"a release build stamps all three with no VCS information",
			"v1.0.0", rev, "false", vcsBuild("(devel)", "", ""), Info{Version: "v1.0.0", Commit: rev}},
		{"a stamped modified=false wins over vcs.modified",
			"v1.0.0", rev, "false", vcsBuild("(devel)", "0000", "true"), Info{Version: "v1.0.0", Commit: rev}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, From(tc.version, tc.commit, tc.modified, tc.bi))
		})
	}
}
