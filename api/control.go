package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/internal/strictjson"
)

// MaxLine bounds one command line in bytes (without the newline).
const MaxLine = 64 << 10

// MaxID bounds a command's id.
const MaxID = 64

// Commands.
const (
	CmdStatus        = "status"         // the sandbox's state, forwards and egress policy
	CmdStop          = "stop"           // stop the sandbox in order; the shim then exits
	CmdStart         = "start"          // (re)start: aborts the attempt in flight, starts a new one
	CmdReset         = "reset"          // stop, remove what persists, start afresh
	CmdSetPolicy     = "set_policy"     // replace the egress policy: allow, upstreams
	CmdAddForward    = "add_forward"    // listen, guest_port
	CmdRemoveForward = "remove_forward" // listen
	CmdPushTime      = "push_time"      // send the host's clock to a VM guest
	CmdClaim         = "claim"          // a warm sandbox becomes the tenant's: bootstrap, allow, upstreams, forwards
)

// ErrBadCommand wraps every decoding error.
var ErrBadCommand = errors.New("bad command")

// Command is one decoded command line.
type Command struct {
	// ID is echoed in the answer (optional, at most MaxID printable bytes).
	ID  string `json:"id,omitempty"`
	Cmd string `json:"cmd"`
	// set_policy: egress rules and named upstreams, as --allow and
	// --upstream take them (the --policy file is not re-read).
	Allow     []string `json:"allow,omitempty"`
	Upstreams []string `json:"upstreams,omitempty"`
	// add_forward, remove_forward.
	Listen    string `json:"listen,omitempty"`
	GuestPort int    `json:"guest_port,omitempty"`
	// claim: the bootstrap document (an object, decoded by the shim as
	// --bootstrap is) and the forwards to open, with allow and upstreams
	// as set_policy takes them.
	Bootstrap json.RawMessage `json:"bootstrap,omitempty"`
	Forwards  []ForwardSpec   `json:"forwards,omitempty"`
	// Volumes (claim): host directories mounted at the guest's /home or
	// /environment before the bootstrap reaches the guest, as --volume
	// does for a run (docs/warm.md).
	Volumes []VolumeSpec `json:"volumes,omitempty"`
}

// VolumeSpec is one volume a claim mounts: the host directory Host at the
// guest directory Guest (/home or /environment).
type VolumeSpec struct {
	Guest string `json:"guest"`
	Host  string `json:"host"`
}

// maxVolumes bounds a claim's volumes: /home and /environment.
const maxVolumes = 2

// ForwardSpec is one forward a claim opens, as add_forward takes it.
type ForwardSpec struct {
	Listen    string `json:"listen"`
	GuestPort int    `json:"guest_port"`
}

// maxForwards bounds a claim's forwards (the shim's own limit applies too).
const maxForwards = 64

// keys lists, per command, the keys besides id and cmd it takes, and
// whether each is required.
var keys = map[string]map[string]bool{
	CmdStatus:        {},
	CmdStop:          {},
	CmdStart:         {},
	CmdReset:         {},
	CmdPushTime:      {},
	CmdSetPolicy:     {"allow": false, "upstreams": false},
	CmdAddForward:    {"listen": true, "guest_port": true},
	CmdRemoveForward: {"listen": true},
	CmdClaim:         {"bootstrap": true, "allow": false, "upstreams": false, "forwards": false, "volumes": false},
}

// IsCommand reports whether name is a known command.
func IsCommand(name string) bool {
	_, ok := keys[name]
	return ok
}

// Commands returns the command names, for usage texts.
func Commands() []string {
	return []string{CmdStatus, CmdStop, CmdStart, CmdReset, CmdSetPolicy, CmdAddForward, CmdRemoveForward, CmdPushTime, CmdClaim}
}

// maxList bounds allow and upstreams (the policy's own limit is 256 rules).
const maxList = 512

// bad is a line that is not a command (AnswerInvalidCommand).
func bad(format string, args ...any) error {
	return badAs(AnswerInvalidCommand, format, args...)
}

// badAs is a refused line with its answer code.
func badAs(code, format string, args ...any) error {
	return Refuse(code, fmt.Errorf("%w: %s", ErrBadCommand, fmt.Sprintf(format, args...)))
}

// commandSchema is what every command line must be before its command
// is known: one object whose known keys have values of their types; the
// keys a command takes are checked once its cmd is read.
var commandSchema = &strictjson.Schema{Kind: strictjson.Object, OpenKeys: true, Fields: []strictjson.Field{
	{Name: "id", Schema: &strictjson.Schema{Kind: strictjson.String}},
	{Name: "cmd", Schema: &strictjson.Schema{Kind: strictjson.String}},
	{Name: "allow", Schema: stringList},
	{Name: "upstreams", Schema: stringList},
	{Name: "listen", Schema: &strictjson.Schema{Kind: strictjson.String}},
	{Name: "guest_port", Schema: &strictjson.Schema{Kind: strictjson.Int}},
	{Name: "bootstrap", Schema: &strictjson.Schema{Kind: strictjson.Object, OpenKeys: true}},
	{Name: "forwards", Schema: &strictjson.Schema{Kind: strictjson.Array, MaxItems: maxForwards, Elem: &strictjson.Schema{Kind: strictjson.Object, Fields: []strictjson.Field{
		{Name: "listen", Schema: &strictjson.Schema{Kind: strictjson.String}, Required: true},
		{Name: "guest_port", Schema: &strictjson.Schema{Kind: strictjson.Int}, Required: true},
	}}}},
	{Name: "volumes", Schema: &strictjson.Schema{Kind: strictjson.Array, MaxItems: maxVolumes, Elem: &strictjson.Schema{Kind: strictjson.Object, Fields: []strictjson.Field{
		{Name: "guest", Schema: &strictjson.Schema{Kind: strictjson.String}, Required: true},
		{Name: "host", Schema: &strictjson.Schema{Kind: strictjson.String}, Required: true},
	}}}},
}}

var stringList = &strictjson.Schema{Kind: strictjson.Array, MaxItems: maxList, Elem: &strictjson.Schema{Kind: strictjson.String}}

// Decode decodes one command line strictly.
func Decode(line []byte) (Command, error) {
	var c Command
	if len(line) > MaxLine {
		return c, bad("line longer than %d bytes", MaxLine)
	}
	if !utf8.Valid(line) {
		return c, bad("not UTF-8")
	}
	if err := strictjson.Check(line, commandSchema); err != nil {
		// The answer still names the line's id and command when the
		// object gives them plainly: a caller waiting on its id learns of
		// the refusal instead of timing out.
		var pre struct {
			ID  any `json:"id"`
			Cmd any `json:"cmd"`
		}
		if json.Unmarshal(line, &pre) == nil {
			if id, ok := pre.ID.(string); ok && len(id) <= MaxID && !strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				c.ID = id
			}
			if cmd, ok := pre.Cmd.(string); ok && IsCommand(cmd) {
				c.Cmd = cmd
			}
		}
		return c, lineError(err)
	}
	raw := map[string]json.RawMessage{}
	if err := json.Unmarshal(line, &raw); err != nil {
		return c, bad("malformed JSON")
	}
	_ = json.Unmarshal(raw["id"], &c.ID)
	if len(c.ID) > MaxID || strings.ContainsFunc(c.ID, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		c.ID = ""
		return c, bad("id must be at most %d bytes without control characters", MaxID)
	}
	_ = json.Unmarshal(raw["cmd"], &c.Cmd)
	if c.Cmd == "" {
		return c, bad(`"cmd" is required (one of %s)`, strings.Join(Commands(), ", "))
	}
	allowed, ok := keys[c.Cmd]
	if !ok {
		return c, badAs(AnswerUnknownCommand, "unknown command %q (known: %s)", safetext.Clean(c.Cmd, 32, '?'), strings.Join(Commands(), ", "))
	}
	for k := range raw {
		if k == "id" || k == "cmd" {
			continue
		}
		if _, ok := allowed[k]; !ok {
			return c, badAs(AnswerInvalidArgument, "%s takes no key %q", c.Cmd, safetext.Clean(k, 32, '?'))
		}
	}
	for k, req := range allowed {
		if _, ok := raw[k]; req && !ok {
			return c, badAs(AnswerInvalidArgument, "%s needs %q", c.Cmd, k)
		}
	}
	// The values' types were checked: these cannot fail.
	for k, dst := range map[string]any{"allow": &c.Allow, "upstreams": &c.Upstreams, "listen": &c.Listen, "guest_port": &c.GuestPort, "forwards": &c.Forwards, "volumes": &c.Volumes} {
		if v, ok := raw[k]; ok {
			_ = json.Unmarshal(v, dst)
		}
	}
	if _, ok := raw["listen"]; ok && c.Listen == "" {
		return c, badAs(AnswerInvalidArgument, `"listen" must not be empty`)
	}
	if _, ok := raw["guest_port"]; ok && (c.GuestPort < 1 || c.GuestPort > 65535) {
		return c, badAs(AnswerInvalidArgument, `"guest_port" must be an integer 1..65535`)
	}
	if b, ok := raw["bootstrap"]; ok {
		c.Bootstrap = append(json.RawMessage(nil), b...)
	}
	for _, f := range c.Forwards {
		if f.Listen == "" || f.GuestPort < 1 || f.GuestPort > 65535 {
			return c, badAs(AnswerInvalidArgument, `each of "forwards" needs "listen" and a "guest_port" 1..65535`)
		}
	}
	for _, v := range c.Volumes {
		if v.Guest != "/home" && v.Guest != "/environment" { // provider.VolumeDirs
			return c, badAs(AnswerInvalidArgument, `each of "volumes" needs a "guest" of "/home" or "/environment"`)
		}
		if v.Host == "" {
			return c, badAs(AnswerInvalidArgument, `each of "volumes" needs a "host" directory`)
		}
	}
	return c, nil
}

// lineError words the walker's refusal of a line: the rule, never the
// value.
func lineError(err error) error {
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return bad("malformed JSON")
	}
	key := e.Key
	if key == "" {
		key = strings.TrimSuffix(e.Path, "[]")
	}
	switch {
	case errors.Is(err, strictjson.ErrSyntax) && e.Offset == 0, errors.Is(err, strictjson.ErrType) && key == "":
		return bad("a command is one JSON object")
	case errors.Is(err, strictjson.ErrTrailing):
		return bad("trailing data after the command object")
	case errors.Is(err, strictjson.ErrDuplicate):
		return bad("key %q given twice", safetext.Clean(e.Key, 32, '?'))
	case errors.Is(err, strictjson.ErrTooMany) && key == "forwards":
		return badAs(AnswerInvalidArgument, "%q has more than %d items", key, maxForwards)
	case errors.Is(err, strictjson.ErrTooMany) && key == "volumes":
		return badAs(AnswerInvalidArgument, "%q has more than %d items (/home and /environment)", key, maxVolumes)
	case errors.Is(err, strictjson.ErrTooMany):
		return badAs(AnswerInvalidArgument, "%q has more than %d items", key, maxList)
	case errors.Is(err, strictjson.ErrType) && key == "guest_port":
		return badAs(AnswerInvalidArgument, `"guest_port" must be an integer 1..65535`)
	case key == "volumes" || strings.HasPrefix(e.Path, "volumes"):
		return badAs(AnswerInvalidArgument, `"volumes" must be a list of {"guest","host"} objects`)
	case key == "forwards" || strings.HasPrefix(e.Path, "forwards"):
		return badAs(AnswerInvalidArgument, `"forwards" must be a list of {"listen","guest_port"} objects`)
	case errors.Is(err, strictjson.ErrType) && (key == "allow" || key == "upstreams"):
		return badAs(AnswerInvalidArgument, "%q must be a list of strings", key)
	case errors.Is(err, strictjson.ErrType) && key == "listen":
		return badAs(AnswerInvalidArgument, "%q must be a string", key)
	case errors.Is(err, strictjson.ErrType) && key == "bootstrap":
		return badAs(AnswerInvalidArgument, `"bootstrap" must be an object (the bootstrap document)`)
	case errors.Is(err, strictjson.ErrType):
		return bad("%q must be a string", key)
	case errors.Is(err, strictjson.ErrDepth):
		return bad("nested too deeply")
	}
	return bad("malformed JSON")
}
