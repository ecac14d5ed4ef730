package egress

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/protocol"
)

// The refusal list's bounds and address.
const (
	// MaxRefusals is how many refusals the guest keeps (the oldest goes
	// first); RefusalAge how long it keeps one.
	MaxRefusals = 64
	RefusalAge  = 10 * time.Minute
	// RefusalsPath is where the HTTP proxy answers, in origin form
	// (http://127.0.0.1:3128/egress/refusals), with the recent refusals
	// as JSON.
	RefusalsPath = "/egress/refusals"
	// RefusalsEnv names the variable that tells the workload the URL.
	RefusalsEnv = "OAC_EGRESS_REFUSALS"
)

// Kinds of refusal: what a program should make of one.
const (
	// RefusalPolicy: the egress policy refuses the target; retrying will
	// not help.
	RefusalPolicy = "policy"
	// RefusalLimit: a sandbox limit (concurrent connections); retry once
	// others have closed.
	RefusalLimit = "limit"
	// RefusalRequest: the target is not one the host can dial (not a
	// name or address, an unsupported network).
	RefusalRequest = "request"
	// RefusalNetwork: the policy allowed it and the network failed (no
	// such name, refused, unreachable, timed out).
	RefusalNetwork = "network"
	// RefusalSandbox: the guest could not ask the host, or the host
	// broker failed.
	RefusalSandbox = "sandbox"
)

// RefusalKind says what kind of refusal code is.
func RefusalKind(code protocol.EgressCode) string {
	switch code {
	case protocol.EgressDenied:
		return RefusalPolicy
	case protocol.EgressResourceExhausted:
		return RefusalLimit
	case protocol.EgressInvalidArgument, protocol.EgressUnsupportedNetwork:
		return RefusalRequest
	case protocol.EgressNameNotResolved, protocol.EgressNameResolutionFailed, protocol.EgressConnectionRefused,
		protocol.EgressUnreachable, protocol.EgressTimedOut:
		return RefusalNetwork
	}
	return RefusalSandbox
}

// Refusal is one refused connection as the workload may read it: only
// what the workload's own client named and what the host answered.
type Refusal struct {
	Time time.Time `json:"time"`
	// SourcePort is the client's source port in the guest (0: none).
	SourcePort int    `json:"source_port,omitempty"`
	Target     string `json:"target"`
	Via        string `json:"via"`
	Kind       string `json:"kind"`
	Code       string `json:"code"`
	Effect     string `json:"effect"`
	Rule       string `json:"rule,omitempty"`
	Reason     string `json:"reason"`
}

// Refusals are the guest's recent refusals: at most MaxRefusals, none
// older than RefusalAge.
type Refusals struct {
	mu   sync.Mutex
	list []Refusal // oldest first
	now  func() time.Time
}

// NewRefusals returns an empty list.
func NewRefusals() *Refusals { return &Refusals{now: time.Now} }

func (l *Refusals) add(t Target, r protocol.EgressReply) {
	e := Refusal{Time: l.now().UTC(), SourcePort: t.SrcPort, Target: sanitize(t.String()), Via: t.Via, Kind: RefusalKind(r.Code),
		Code: r.Code.String(), Effect: r.Effect, Rule: sanitize(r.Rule), Reason: sanitize(r.Reason)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) == MaxRefusals {
		copy(l.list, l.list[1:])
		l.list = l.list[:MaxRefusals-1]
	}
	l.list = append(l.list, e)
}

// Recent returns the refusals younger than RefusalAge that match port
// (the source port; 0: any) and target (host:port as the client named
// it, case-insensitive; "": any), newest first.
func (l *Refusals) Recent(port int, target string) []Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := l.now().Add(-RefusalAge)
	out := []Refusal{}
	for i := len(l.list) - 1; i >= 0; i-- {
		e := l.list[i]
		if e.Time.Before(since) {
			break
		}
		if (port == 0 || e.SourcePort == port) && (target == "" || strings.EqualFold(e.Target, target)) {
			out = append(out, e)
		}
	}
	return out
}

// refusalsAnswer is the JSON the workload reads.
type refusalsAnswer struct {
	Refusals []Refusal `json:"refusals"`
	Max      int       `json:"max"`
	MaxAgeS  int       `json:"max_age_s"`
}

// isRefusalsRequest reports whether req asks the proxy itself for the
// refusal list: origin form (a client that honours NO_PROXY), or
// absolute form naming the proxy's own address.
func (p *Proxies) isRefusalsRequest(req *http.Request) bool {
	if req.URL == nil || req.URL.Path != RefusalsPath {
		return false
	}
	return !req.URL.IsAbs() || (req.URL.Scheme == "http" && req.URL.Host == p.HTTPAddr)
}

// serveRefusals answers a request for the refusal list, filtered by the
// query's port (the asker's own source port) and target.
func (p *Proxies) serveRefusals(w io.Writer, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		writeJSON(w, req, http.StatusMethodNotAllowed, map[string]string{"error": "GET " + RefusalsPath + "[?port=SOURCE_PORT][&target=HOST:PORT]"})
		return
	}
	port, target, err := parseRefusalsQuery(req.URL.RawQuery)
	if err != nil {
		writeJSON(w, req, http.StatusBadRequest, map[string]string{"error": sanitize(err.Error())})
		return
	}
	writeJSON(w, req, http.StatusOK, refusalsAnswer{Refusals: p.exit.refusals.Recent(port, target), Max: MaxRefusals, MaxAgeS: int(RefusalAge / time.Second)})
}

// parseRefusalsQuery reads the workload's query: port (a source port,
// 1..65535) and target (host:port), each at most once, nothing else.
func parseRefusalsQuery(raw string) (port int, target string, err error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return 0, "", fmt.Errorf("bad query: %w", err)
	}
	for k, v := range q {
		if (k != "port" && k != "target") || len(v) != 1 {
			return 0, "", fmt.Errorf("bad query: use ?port=SOURCE_PORT and/or ?target=HOST:PORT, each once")
		}
	}
	if q.Has("port") {
		port, err = strconv.Atoi(q.Get("port"))
		if err != nil || port < 1 || port > 65535 {
			return 0, "", fmt.Errorf("bad query: port %q is not a source port 1..65535", q.Get("port"))
		}
	}
	target = q.Get("target")
	if len(target) > protocol.MaxEgressHost+6 {
		return 0, "", fmt.Errorf("bad query: target longer than %d bytes", protocol.MaxEgressHost+6)
	}
	return port, target, nil
}

func writeJSON(w io.Writer, req *http.Request, status int, v any) {
	body, _ := json.Marshal(v)
	body = append(body, '\n')
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
		status, http.StatusText(status), len(body))
	if req.Method == http.MethodHead {
		body = nil
	}
	_, _ = io.WriteString(w, head+string(body))
}
