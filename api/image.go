package api

// What oac-image's commands print with --json, one object each (here,
// beside oac-shim's, so a caller codes against one package); the
// schema of each is in schema/ (image-*.schema.json), held to these types
// by its tests.

// ImageStageReport is what oac-image stage --json prints: every artifact
// staged, in order, and the failure that ended the run (exit status 1).
type ImageStageReport struct {
	SchemaVersion int          `json:"schema_version"`
	Staged        []StagedFile `json:"staged"`
	Error         *StageError  `json:"error,omitempty"`
}

// StagedFile is one verified file in the store.
type StagedFile struct {
	// Name is the artifact's name (--name with --url; empty when none).
	Name   string `json:"name"`
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Cached: the store had it already (verified); nothing was downloaded.
	Cached bool `json:"cached"`
	// Downloaded counts the bytes received by this run.
	Downloaded int64 `json:"downloaded"`
	// Mirror is the host the last bytes came from (absent when cached).
	Mirror string `json:"mirror,omitempty"`
	// Repaired says what was wrong with a damaged copy the store held.
	Repaired string `json:"repaired,omitempty"`
	// FailedMirrors says how each mirror that failed before another
	// served the file failed (named by host).
	FailedMirrors []string `json:"failed_mirrors"`
}

// StageError is why a stage run stopped: Code is stage's (corrupt,
// truncated, size, http, stalled, ...).
type StageError struct {
	Name    string `json:"name"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ImageVerifyReport is what oac-image manifest verify --json prints.
type ImageVerifyReport struct {
	SchemaVersion int    `json:"schema_version"`
	Manifest      string `json:"manifest"`
	// Schema and Release are the manifest's own.
	Schema  int    `json:"schema"`
	Release string `json:"release"`
	// Artifacts is each artifact's file, checked (only with --store or
	// --dir; else empty: the manifest alone was checked, and is valid).
	Artifacts []VerifiedFile `json:"artifacts"`
	// AllOK: every file checked verifies (exit status 0).
	AllOK bool `json:"all_ok"`
}

// VerifiedFile is one artifact's file, checked.
type VerifiedFile struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Path is where it was found (absent when missing).
	Path  string `json:"path,omitempty"`
	Size  int64  `json:"size"`
	Error string `json:"error,omitempty"`
}

// ImageBuildReport is what oac-image build --json prints.
type ImageBuildReport struct {
	SchemaVersion int           `json:"schema_version"`
	Outputs       []BuiltOutput `json:"outputs"`
	// Entries is the number of entries in the image tree.
	Entries int `json:"entries"`
	// TreeSHA256 identifies the tree's content.
	TreeSHA256 string `json:"tree_sha256"`
}

// BuiltOutput is one output of a build: a file, or a directory (dir, oci,
// e2b) whose SHA256 is the digest of its files.
type BuiltOutput struct {
	Kind   string `json:"kind"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// ImageListReport is what oac-image list FILE --json prints: the members of
// an initramfs.
type ImageListReport struct {
	SchemaVersion int              `json:"schema_version"`
	Entries       []ImageListEntry `json:"entries"`
}

// ImageListEntry is one member: its absolute path in the guest, its mode as
// ls shows it, owner, size and, for a device, its number MAJOR:MINOR.
type ImageListEntry struct {
	Path   string `json:"path"`
	Mode   string `json:"mode"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Size   int64  `json:"size"`
	Device string `json:"device,omitempty"`
}
