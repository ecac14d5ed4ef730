package api

import "time"

// StatusResult answers the status command.
type StatusResult struct {
	Status
	// GuestConnected: a guest session is live (forwards can be carried).
	GuestConnected bool `json:"guest_connected"`
	// Forwards in force, with the connections each carries now.
	Forwards []ForwardInfo `json:"forwards"`
	// Egress describes the policy in force, one line per rule/upstream.
	Egress []string `json:"egress"`
}

// ForwardResult answers add_forward.
type ForwardResult struct {
	ForwardInfo
	// URL is http://LISTEN for a TCP forward.
	URL string `json:"url,omitempty"`
}

// PolicyResult answers set_policy.
type PolicyResult struct {
	Egress []string `json:"egress"`
}

// ClaimResult answers claim: the attempt the claimed sandbox runs as and
// the forwards the claim opened (bound). Its state moves from warm to
// starting, then ready, as events say.
type ClaimResult struct {
	Attempt  uint64          `json:"attempt"`
	Forwards []ForwardResult `json:"forwards"`
	Egress   []string        `json:"egress"`
}

// TimeResult answers push_time.
type TimeResult struct {
	TimeUnixNano int64 `json:"time_unix_nano"`
}

// StartResult answers start and reset.
type StartResult struct {
	Attempt uint64 `json:"attempt"`
}

// Answer answers one command; on the wire it is one JSON object per line
// with "event":"answer", so it can share stdout with the events.
type Answer struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Event   string    `json:"event"`
	// SchemaVersion is SchemaVersion, as on every event.
	SchemaVersion int `json:"schema_version"`
	// Seq is the line's number on the events output (Event.Seq) when the
	// answer is written there (--control stdin); absent on the control
	// socket, whose answers are not events of the run.
	Seq     uint64 `json:"seq,omitempty"`
	ID      string `json:"id,omitempty"`
	Command string `json:"command,omitempty"`
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	// Code is the answer code when OK is false (AnswerCodes): what a
	// caller branches on.
	Code string `json:"code,omitempty"`
	// Result is the command's result (status, the forward added, the
	// policy in force, the time pushed); absent on error.
	Result any `json:"result,omitempty"`
}

// Status is the sandbox's state: what the status command answers (and
// the lifecycle state machine holds).
type Status struct {
	ServerID string `json:"server_id"`
	State    State  `json:"state"`
	Message  string `json:"message,omitempty"`
	// Code is the failure code when State is failed (Failures).
	Code     string `json:"code,omitempty"`
	URL      string `json:"url,omitempty"`
	GuestURL string `json:"guest_url,omitempty"`
	Username string `json:"username,omitempty"`
	Password string `json:"-"`
	// Attempt numbers the starts: the attempt this state belongs to.
	Attempt uint64 `json:"attempt"`
}

// ServerID is the server id of the sandbox called name.
func ServerID(name string) string { return "sandbox:" + name }

// ForwardInfo describes one forward in force.
type ForwardInfo struct {
	// Listen is the bound address (a port 0 resolved) or socket path.
	Listen    string `json:"listen"`
	GuestPort int    `json:"guest_port"`
	// Active counts the connections it carries now.
	Active int `json:"active"`
}
