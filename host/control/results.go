package control

import (
	"github.com/oac/sandbox-agent/host/controller"
	"github.com/oac/sandbox-agent/host/forward"
)

// StatusResult answers the status command.
type StatusResult struct {
	controller.Status
	// GuestConnected: a guest session is live (forwards can be carried).
	GuestConnected bool `json:"guest_connected"`
	// Forwards in force, with the connections each carries now.
	Forwards []forward.Info `json:"forwards"`
	// Egress describes the policy in force, one line per rule/upstream.
	Egress []string `json:"egress"`
}

// ForwardResult answers add_forward.
type ForwardResult struct {
	forward.Info
	// URL is http://LISTEN for a TCP forward.
	URL string `json:"url,omitempty"`
}

// PolicyResult answers set_policy.
type PolicyResult struct {
	Egress []string `json:"egress"`
}

// TimeResult answers push_time.
type TimeResult struct {
	TimeUnixNano int64 `json:"time_unix_nano"`
}

// StartResult answers start and reset.
type StartResult struct {
	Attempt uint64 `json:"attempt"`
}
