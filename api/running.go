package api

import "time"

// The running sandboxes of a keep root and stopping them (oac-shim list
// --running, oac-shim stop): schema/running.schema.json and
// schema/stop.schema.json.

// Run kinds: how a running sandbox was started.
const (
	RunThrowaway = "run"  // oac-shim run: destroyed when its shim exits
	RunKept      = "kept" // oac-shim start: a kept sandbox
)

// RunningEntry is one running sandbox: a shim that runs it now.
type RunningEntry struct {
	Name string `json:"name"`
	// Kind is RunThrowaway or RunKept; empty when its record cannot be
	// read (Message says why).
	Kind     string `json:"kind"`
	Provider string `json:"provider"`
	// PID is its shim's process id (0 when its record cannot be read).
	PID int `json:"pid"`
	// ControlSocket is the shim's control socket (--control-socket), an
	// absolute path; absent when it serves none.
	ControlSocket string `json:"control_socket,omitempty"`
	// OutliveParent: the shim runs with --outlive-parent, so oac-shim
	// attach takes it up (absent otherwise).
	OutliveParent bool      `json:"outlive_parent,omitempty"`
	Started       time.Time `json:"started"`
	// Version is the shim's oac-shim version.
	Version string `json:"version"`
	Message string `json:"message,omitempty"`
}

// CleanedEntry is the record of a shim that died without removing it (a
// SIGKILL, a crash), found and removed: nothing of it runs.
type CleanedEntry struct {
	Name    string `json:"name"`
	Message string `json:"message"`
}

// RunningReport is what oac-shim list --running --json prints.
type RunningReport struct {
	SchemaVersion int            `json:"schema_version"`
	Sandboxes     []RunningEntry `json:"sandboxes"`
	Cleaned       []CleanedEntry `json:"cleaned"`
}

// StopOutcome says what oac-shim stop did to one sandbox.
type StopOutcome string

// Stop outcomes.
const (
	// StopStopped: its shim was asked to stop in order and exited within
	// the grace (its sandbox stopped and was torn down).
	StopStopped StopOutcome = "stopped"
	// StopKilled: its shim did not exit within the grace and was killed
	// (SIGKILL; its runtime dies with it).
	StopKilled StopOutcome = "killed"
	// StopFailed: its shim could not be asked or killed (the message says
	// why); it may still run.
	StopFailed StopOutcome = "failed"
	// StopNotRunning: no shim runs a sandbox of that name (stop NAME).
	StopNotRunning StopOutcome = "not_running"
)

// StopOutcomes lists every StopOutcome.
var StopOutcomes = []StopOutcome{StopStopped, StopKilled, StopFailed, StopNotRunning}

// How a shim was asked to stop.
const (
	StopViaControl = "control" // the stop command on its control socket
	StopViaSignal  = "signal"  // SIGTERM to its proven process
)

// StopEntry is what happened to one sandbox.
type StopEntry struct {
	Name    string      `json:"name"`
	Outcome StopOutcome `json:"outcome"`
	// Via is StopViaControl or StopViaSignal: how it was asked.
	Via     string `json:"via,omitempty"`
	Message string `json:"message,omitempty"`
	// PID is its shim's.
	PID int `json:"pid,omitempty"`
	// ElapsedMS is from the request to the shim's exit (or the kill).
	ElapsedMS int64 `json:"elapsed_ms"`
}

// StopReport is what oac-shim stop --json prints.
type StopReport struct {
	SchemaVersion int `json:"schema_version"`
	// GraceMS is how long each shim was given to exit.
	GraceMS   int64          `json:"grace_ms"`
	Sandboxes []StopEntry    `json:"sandboxes"`
	Cleaned   []CleanedEntry `json:"cleaned"`
	// AllStopped: every sandbox asked for was stopped (or ran no more);
	// the exit status is 0 exactly then.
	AllStopped bool `json:"all_stopped"`
}
