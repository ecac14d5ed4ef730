package protocol

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"time"
)

// Data plane capabilities (see the package doc, "Data plane"). A guest
// lists in Hello what its transport lets it do; a host lists at most one
// in Welcome, with Welcome.DataToken, and only when its provider's
// transport allows it.
const (
	// CapDataFD: connections arrive as socket descriptors (one end of a
	// socketpair the host made) on a channel the guest dials on its unix
	// transport once, beside the session.
	CapDataFD = "data_fd"
	// CapDataDial: each connection is a connection of its own the guest
	// dials on its transport's endpoint (vsock), naming its target first.
	CapDataDial = "data_dial"
	// CapDataHand: on the fd channel, the guest may hand the host the
	// workload's own connected TCP socket with a Connect (Connect.Hand):
	// the host then carries that socket itself, and no byte of the
	// connection passes through the guest. A guest lists it with
	// CapDataFD; a host lists it beside CapDataFD.
	CapDataHand = "data_hand"
	// CapDataDirect: on the fd channel, the guest may ask for the host's
	// own connected socket (Connect.Direct) and put it in place of the
	// workload's, so the bytes go from the workload to the upstream with
	// no relay (direct mode, docs/egress.md). A host lists it beside
	// CapDataFD only when it was started with --data-plane direct; a guest
	// lists it with CapDataFD when its kernel can trap connect for the
	// workload (a seccomp listener with SECCOMP_IOCTL_NOTIF_ADDFD).
	CapDataDirect = "data_direct"
)

// Data plane limits and timeouts.
const (
	// DataTokenBytes is the size of the random token that authenticates
	// the guest's data connections (hex-encoded in Welcome.DataToken).
	DataTokenBytes = 16
	// MaxDataToken bounds a token read from the peer.
	MaxDataToken = 64
	// DataChannelTimeout bounds the fd channel's setup: the host waits
	// that long after Welcome for the guest's channel and its Channel
	// frame, the guest that long for the host's answer. A guest whose
	// channel does not come up carries its connections as egress streams.
	DataChannelTimeout = 5 * time.Second
	// DataWriteTimeout bounds one write of the host on the fd channel: a
	// guest that stops reading its channel loses it (its connections then
	// go over egress streams), it never blocks the host.
	DataWriteTimeout = 10 * time.Second
	// MaxPendingFDs bounds the descriptors a guest holds that no frame
	// has claimed yet; one recvmsg takes at most this many.
	MaxPendingFDs = 4
	// MaxHandReply bounds Connect.Reply, MaxHandEarly Connect.Early.
	MaxHandReply = 64
	MaxHandEarly = 2 << 10
)

// NewDataToken returns a fresh random token for Welcome.DataToken.
func NewDataToken() (string, error) {
	b := make([]byte, DataTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("data token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// TokenMatches compares a token the peer sent with the session's in
// constant time; an empty session token matches nothing.
func TokenMatches(got, want string) bool {
	return want != "" && len(got) == len(want) && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// Channel is the first frame on the guest's fd channel (guest -> host,
// Token set) and the host's acceptance (host -> guest, empty).
type Channel struct {
	Token string `json:"token,omitempty"`
}

// Connect asks the host for an egress connection on the data plane: on
// the fd channel with an ID (the answer names it), or as the first frame
// of a dialed data connection with the Token. Host, Port and Via are an
// egress stream header's, checked the same way.
//
// Hand (fd channel only, CapDataHand): the frame carries one descriptor,
// the workload's connected TCP socket, and the host carries the
// connection between that socket and the upstream itself. On an OK
// answer the host first writes Reply to the socket (the proxy's success
// answer to its client: "200 Connection established", a SOCKS reply) and
// Early to the upstream (what the client sent before the answer), then
// moves the bytes; on a failure it has closed its copy unused and the
// guest answers the client itself.
//
// Direct (fd channel only, CapDataDirect, Via ViaDirect): an OK answer
// carries the host's own connected TCP socket, locked so it can only ever
// talk to the upstream the broker allowed (see docs/threat-model.md); the
// guest puts it in place of the workload's socket. Direct carries no
// descriptor, reply or early bytes.
type Connect struct {
	ID     uint64 `json:"id,omitempty"`
	Token  string `json:"token,omitempty"`
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Via    string `json:"via,omitempty"`
	Hand   bool   `json:"hand,omitempty"`
	Reply  []byte `json:"reply,omitempty"`
	Early  []byte `json:"early,omitempty"`
	Direct bool   `json:"direct,omitempty"`
	// SrcPort is the connection's source port in the guest, as on an
	// egress stream's header (protocol 1.10).
	SrcPort int `json:"src_port,omitempty"`
}

// Header returns the egress stream header Connect stands for: what the
// host's broker decides on, whichever carrier asked.
func (c Connect) Header() StreamHeader {
	return StreamHeader{Kind: KindEgress, Host: c.Host, Port: c.Port, Via: c.Via, SrcPort: c.SrcPort}
}

// Validate checks a Connect received from the peer: the header's rules,
// and a token of at most MaxDataToken bytes.
func (c Connect) Validate() error {
	if len(c.Token) > MaxDataToken {
		return fmt.Errorf("%w: data token longer than %d bytes", ErrBadBody, MaxDataToken)
	}
	if len(c.Reply) > MaxHandReply || len(c.Early) > MaxHandEarly {
		return fmt.Errorf("%w: a handed connection's reply or early bytes over %d/%d bytes", ErrBadBody, MaxHandReply, MaxHandEarly)
	}
	if c.Direct && (c.Hand || c.Via != ViaDirect) {
		return fmt.Errorf("%w: a direct Connect hands no socket and has via %q", ErrBadBody, ViaDirect)
	}
	if !c.Hand && (len(c.Reply) > 0 || len(c.Early) > 0) {
		return fmt.Errorf("%w: reply and early bytes belong to a handed connection", ErrBadBody)
	}
	return c.Header().Validate()
}

// Connected answers a Connect: an EgressReply naming the request. On the
// fd channel an OK answer carries exactly one descriptor (SCM_RIGHTS):
// the guest's end of the connection; a failure carries none.
type Connected struct {
	ID uint64 `json:"id,omitempty"`
	EgressReply
}

// Forward hands the guest one connection the host accepted on a forward's
// listener (fd channel only, with exactly one descriptor attached): the
// guest joins it to 127.0.0.1:Port. Name is informational.
type Forward struct {
	Port int    `json:"port"`
	Name string `json:"name,omitempty"`
}

// Header returns the forward stream header Forward stands for.
func (f Forward) Header() StreamHeader {
	return StreamHeader{Kind: KindForward, Port: f.Port, Name: f.Name}
}
