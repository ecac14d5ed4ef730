package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
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
}

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
}

// IsCommand reports whether name is a known command.
func IsCommand(name string) bool {
	_, ok := keys[name]
	return ok
}

// Commands returns the command names, for usage texts.
func Commands() []string {
	return []string{CmdStatus, CmdStop, CmdStart, CmdReset, CmdSetPolicy, CmdAddForward, CmdRemoveForward, CmdPushTime}
}

// maxList bounds allow and upstreams (the policy's own limit is 256 rules).
const maxList = 512

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadCommand, fmt.Sprintf(format, args...))
}

// Decode decodes one command line strictly.
func Decode(line []byte) (Command, error) {
	var c Command
	if len(line) > MaxLine {
		return c, bad("line longer than %d bytes", MaxLine)
	}
	if !utf8.Valid(line) {
		return c, bad("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return c, bad("a command is one JSON object")
	}
	raw := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return c, bad("malformed JSON")
		}
		k, ok := tok.(string)
		if !ok {
			return c, bad("malformed JSON")
		}
		if _, dup := raw[k]; dup {
			return c, bad("key %q given twice", printable(k))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return c, bad("malformed JSON")
		}
		raw[k] = v
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return c, bad("malformed JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return c, bad("trailing data after the command object")
	}
	if err := str(raw, "id", &c.ID); err != nil {
		return c, err
	}
	if len(c.ID) > MaxID || strings.ContainsFunc(c.ID, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		c.ID = ""
		return c, bad("id must be at most %d bytes without control characters", MaxID)
	}
	if err := str(raw, "cmd", &c.Cmd); err != nil {
		return c, err
	}
	if c.Cmd == "" {
		return c, bad(`"cmd" is required (one of %s)`, strings.Join(Commands(), ", "))
	}
	allowed, ok := keys[c.Cmd]
	if !ok {
		return c, bad("unknown command %q (known: %s)", printable(c.Cmd), strings.Join(Commands(), ", "))
	}
	for k := range raw {
		if k == "id" || k == "cmd" {
			continue
		}
		if _, ok := allowed[k]; !ok {
			return c, bad("%s takes no key %q", c.Cmd, printable(k))
		}
	}
	for k, req := range allowed {
		if _, ok := raw[k]; req && !ok {
			return c, bad("%s needs %q", c.Cmd, k)
		}
	}
	if err := list(raw, "allow", &c.Allow); err != nil {
		return c, err
	}
	if err := list(raw, "upstreams", &c.Upstreams); err != nil {
		return c, err
	}
	if err := str(raw, "listen", &c.Listen); err != nil {
		return c, err
	}
	if _, ok := raw["listen"]; ok && c.Listen == "" {
		return c, bad(`"listen" must not be empty`)
	}
	if v, ok := raw["guest_port"]; ok {
		n, err := strictInt(v)
		if err != nil || n < 1 || n > 65535 {
			return c, bad(`"guest_port" must be an integer 1..65535`)
		}
		c.GuestPort = n
	}
	return c, nil
}

func printable(s string) string {
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

func str(raw map[string]json.RawMessage, k string, dst *string) error {
	v, ok := raw[k]
	if !ok {
		return nil
	}
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, dst) != nil {
		return bad("%q must be a string", k)
	}
	return nil
}

func list(raw map[string]json.RawMessage, k string, dst *[]string) error {
	v, ok := raw[k]
	if !ok {
		return nil
	}
	if len(v) == 0 || v[0] != '[' {
		return bad("%q must be a list of strings", k)
	}
	var items []json.RawMessage
	if json.Unmarshal(v, &items) != nil {
		return bad("%q must be a list of strings", k)
	}
	if len(items) > maxList {
		return bad("%q has more than %d items", k, maxList)
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		var s string
		if len(it) == 0 || it[0] != '"' || json.Unmarshal(it, &s) != nil {
			return bad("%q must be a list of strings", k)
		}
		out = append(out, s)
	}
	*dst = out
	return nil
}

func strictInt(v json.RawMessage) (int, error) {
	s := string(v)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || len(s) > 6 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("not an integer")
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n, nil
}
