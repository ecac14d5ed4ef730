package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
)

// Version is the version report of program, this build.
func Version(program string) api.VersionReport {
	b := buildinfo.Read()
	return api.VersionReport{
		Program: program, Version: b.Version, Commit: b.Commit, Modified: b.Modified, SchemaVersion: api.SchemaVersion,
		ProtocolMin: protocol.MinVersion, ProtocolMax: protocol.MaxVersion,
		GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH,
	}
}

// PrintVersion writes program's version: one line, or with asJSON the
// object of schema/version.schema.json.
func PrintVersion(w io.Writer, program string, asJSON bool) {
	v := Version(program)
	if asJSON {
		PrintJSON(w, v)
		return
	}
	build := ""
	if v.Commit != "" {
		build = ", commit " + v.Commit
	}
	if v.Modified {
		build += ", modified"
	}
	fmt.Fprintf(w, "%s %s (protocol %d..%d%s)\n", v.Program, v.Version, v.ProtocolMin, v.ProtocolMax, build)
}

// PrintJSON writes v as indented JSON, the form of every --json output.
func PrintJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func versionCommand(program string) *Command {
	return &Command{
		Name: "version", Summary: "print the version (--json: schema/version.schema.json)",
		Run: func(args []string, env Env) int {
			fs := FlagSet(program + " version")
			asJSON := fs.Bool("json", false, "print one JSON object (schema/version.schema.json)")
			args, code, ok := Parse(fs, args, env)
			if !ok {
				return code
			}
			if len(args) > 0 {
				return Usagef(fs, env.Stderr, "takes no arguments, not %q", args)
			}
			PrintVersion(env.Stdout, program, *asJSON)
			return 0
		},
	}
}
