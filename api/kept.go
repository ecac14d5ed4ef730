package api

import "time"

// KeptState is a kept sandbox's last state, as its record and oac-shim
// list say it (schema/record.schema.json#/$defs/State).
type KeptState string

// Kept states. Creating, Resetting and Destroying last only while a shim
// holds the sandbox's lock: found with the lock free, they are what a
// shim killed half way left, and the next command on the name discards
// the sandbox.
const (
	KeptCreating   KeptState = "creating"
	KeptCreated    KeptState = "created"
	KeptRunning    KeptState = "running"
	KeptStopped    KeptState = "stopped"
	KeptFailed     KeptState = "failed"
	KeptResetting  KeptState = "resetting"
	KeptDestroying KeptState = "destroying"
)

// KeptStates lists every KeptState.
var KeptStates = []KeptState{KeptCreating, KeptCreated, KeptRunning, KeptStopped, KeptFailed, KeptResetting, KeptDestroying}

// ListEntry is one kept sandbox in oac-shim list.
type ListEntry struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	// Image is the image's reference; ImageDigest its digest when known.
	Image       string `json:"image"`
	ImageDigest string `json:"image_digest,omitempty"`
	// State is the last state; "running" only while a shim runs it (a
	// shim that died running it leaves "stopped").
	State       KeptState  `json:"state"`
	Message     string     `json:"message,omitempty"`
	Created     time.Time  `json:"created"`
	LastStarted *time.Time `json:"last_started,omitempty"`
	// SizeBytes is what its directory under the keep root takes on disk.
	SizeBytes int64 `json:"size_bytes"`
	// InUse: a shim holds it now.
	InUse bool `json:"in_use"`
}

// ListReport is what oac-shim list --json prints (schema/list.schema.json).
type ListReport struct {
	SchemaVersion int         `json:"schema_version"`
	Sandboxes     []ListEntry `json:"sandboxes"`
}
