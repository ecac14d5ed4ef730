package protocol

import (
	"fmt"
	"strings"
)

// Protocol versions this build speaks.
const (
	MinVersion = 1
	MaxVersion = 1
)

// Hello is the guest's first message on the control stream.
type Hello struct {
	MinVersion   int      `json:"min_version"`
	MaxVersion   int      `json:"max_version"`
	AgentVersion string   `json:"agent_version"`
	PID          int      `json:"pid"`
	Capabilities []string `json:"capabilities,omitempty"`
}

// Welcome is the host's answer to a Hello it accepts.
type Welcome struct {
	Version      int      `json:"version"`
	HostVersion  string   `json:"host_version"`
	Capabilities []string `json:"capabilities,omitempty"`
	// TimeUnixNano is the host's wall clock when Welcome was sent; VM
	// guests set their clock from it.
	TimeUnixNano int64 `json:"time_unix_nano"`
	// AllowLoopbackLink: the operator started the host with
	// --allow-loopback-link, so the guest accepts a ws:// or wss:// Link
	// URL on a loopback host. Only the host's own flag sets it; the
	// bootstrap document cannot.
	AllowLoopbackLink bool `json:"allow_loopback_link,omitempty"`
	// DataToken authenticates the guest's data plane connections; set
	// when Capabilities lists CapDataFD or CapDataDial.
	DataToken string `json:"data_token,omitempty"`
}

// Guest states reported in State messages.
const (
	StateStarting = "starting"
	StateReady    = "ready"
	StateFailed   = "failed"
	StateStopped  = "stopped"
)

// Reasons of a failed State.
const (
	ReasonBootstrap       = "bootstrap_invalid" // the guest refused the bootstrap
	ReasonDaemonUnhealthy = "daemon_unhealthy"  // no healthy answer before the deadline
	ReasonDaemonFailed    = "daemon_failed"     // the daemon could not start, or exited
	ReasonSandboxIO       = "sandbox_io_failed" // the private file or oac-sandbox-io failed
	ReasonPlatformDoor    = "platform_door"     // a door to the host the guest cannot close for the workload
	ReasonGuest           = "guest_failed"      // anything else the agent could not do
)

// Capabilities named in Hello and Welcome.
const (
	// CapProcess: the sender accepts (Welcome) or sends (Hello) Process
	// messages. A guest sends them only to a host whose Welcome lists it.
	CapProcess = "process"
	// CapForward: the guest (Hello) accepts forward streams from the host.
	// A host opens none to a guest that did not list it.
	CapForward = "forward"
	// CapTime: the guest (Hello) sets its clock from Time messages; a host
	// sends Time only to a guest that listed it (VM guests do).
	CapTime = "time"
	// CapAbort: the host (Welcome) takes Abort messages; a guest sends
	// them only to a host that listed it.
	CapAbort = "abort"
)

// Abort tells the host that the guest's side of one of its egress
// streams is gone for good (the workload's client was killed or reset
// its connection): the host closes the upstream connection at once
// instead of carrying its bytes into a stream nobody reads. Stream is the
// yamux stream id. A yamux close is only a half-close, so without it the
// host would learn nothing until yamux's StreamCloseTimeout.
type Abort struct {
	Stream uint32 `json:"stream"`
}

// Time pushes the host's wall clock to a guest that listed CapTime (after
// the host slept, say). TimeUnixNano is stamped when the message is sent.
type Time struct {
	TimeUnixNano int64 `json:"time_unix_nano"`
}

// HasCapability reports whether caps lists c.
func HasCapability(caps []string, c string) bool {
	for _, x := range caps {
		if x == c {
			return true
		}
	}
	return false
}

// ProcessStatus describes one supervised process in the guest. As the body
// of a Process message it is one of: started (Running, PID, Restarts),
// exited (not Running, ExitCode or Signal) or restarting (not Running,
// Restarts counting this restart, RestartInMS the delay before it).
type ProcessStatus struct {
	Name        string `json:"name"`
	PID         int    `json:"pid,omitempty"`
	Running     bool   `json:"running"`
	ExitCode    *int   `json:"exit_code,omitempty"`
	Signal      string `json:"signal,omitempty"`
	Restarts    int    `json:"restarts,omitempty"`
	RestartInMS int64  `json:"restart_in_ms,omitempty"`
}

// State reports a change in the guest. A ready State carries the daemon's
// URL inside the guest and the Basic auth username; never the password.
type State struct {
	State   string `json:"state"`
	Message string `json:"message,omitempty"`
	// Reason says, on a failed State, which part failed (Reason*). The
	// host maps it to a failure code and trusts it no further: a guest
	// can only misname its own failure.
	Reason   string         `json:"reason,omitempty"`
	Process  *ProcessStatus `json:"process,omitempty"`
	URL      string         `json:"url,omitempty"`
	Username string         `json:"username,omitempty"`
}

// Shutdown asks the guest to stop its processes within GraceMS and report
// "stopped".
type Shutdown struct {
	Reason  string `json:"reason"`
	GraceMS int64  `json:"grace_ms"`
}

// Error codes.
const (
	CodeVersionMismatch = "version_mismatch"
	CodeProtocol        = "protocol_error"
	CodeBootstrap       = "bootstrap_invalid"
	CodeInternal        = "internal"
)

// Error ends a session. For CodeVersionMismatch the sender fills in its own
// version range.
type Error struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	MinVersion int    `json:"min_version,omitempty"`
	MaxVersion int    `json:"max_version,omitempty"`
}

// PeerError is an Error frame received from the peer.
type PeerError struct{ Err Error }

func (e *PeerError) Error() string {
	return fmt.Sprintf("peer error %s: %s", e.Err.Code, e.Err.Message)
}

// Stream kinds named in StreamHeader.
const (
	KindControl = "control"
	KindLog     = "log"
	KindEgress  = "egress"
	KindForward = "forward"
	// KindDNS asks the host whether a name may be resolved (see CapDNS).
	KindDNS = "dns"
)

// StreamHeader is the first frame on every stream.
type StreamHeader struct {
	Kind string `json:"kind"`
	Name string `json:"name,omitempty"`
	// Host, Port and Via name the target of an egress stream: Host is a
	// DNS name or an IP literal (IPv6 without brackets) exactly as the
	// client gave it; the host normalizes and checks it. A forward stream
	// carries Port only: the guest port on 127.0.0.1 it connects to.
	// Every other kind carries none of them.
	Host string `json:"host,omitempty"`
	Port int    `json:"port,omitempty"`
	Via  string `json:"via,omitempty"`
	// SrcPort is an egress connection's source port in the guest (the
	// workload client's end), 0..65535, 0 when unknown; the guest's word,
	// for events only (protocol 1.10).
	SrcPort int `json:"src_port,omitempty"`
}

// MaxStreamName bounds StreamHeader.Name.
const MaxStreamName = 128

// Validate checks a header received from the peer.
func (h StreamHeader) Validate() error {
	switch h.Kind {
	case KindControl, KindLog, KindEgress, KindForward, KindDNS:
	default:
		return fmt.Errorf("%w: unknown stream kind %q", ErrBadBody, truncate(h.Kind, 32))
	}
	if len(h.Name) > MaxStreamName {
		return fmt.Errorf("%w: stream name longer than %d bytes", ErrBadBody, MaxStreamName)
	}
	if strings.ContainsFunc(h.Name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("%w: stream name contains control characters", ErrBadBody)
	}
	return h.validateEgress()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
