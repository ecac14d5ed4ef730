package api

// VersionReport is what `oac-shim version --json` prints (and oac-image's
// and oac-guest's): schema/version.schema.json. A caller compares
// SchemaVersion with the one it was built for before it reads any event.
type VersionReport struct {
	// Program is the binary: oac-shim, oac-image, oac-guest.
	Program string `json:"program"`
	// Version is the release (stamped at link time), else the module
	// version the Go toolchain recorded (go install ...@vX.Y.Z), else
	// "dev".
	Version string `json:"version"`
	// Commit is the commit the binary was built from; absent when the
	// build does not know it (a go install of a module version).
	Commit string `json:"commit,omitempty"`
	// Modified is true when the tree had uncommitted changes.
	Modified bool `json:"modified"`
	// SchemaVersion is the version of the events, answers and reports
	// this binary writes (SchemaVersion).
	SchemaVersion int `json:"schema_version"`
	// ProtocolMin and ProtocolMax are the host-guest protocol versions
	// this build speaks.
	ProtocolMin int `json:"protocol_min"`
	ProtocolMax int `json:"protocol_max"`
	// GoVersion, OS and Arch are the toolchain and platform it was built
	// with and for.
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}
