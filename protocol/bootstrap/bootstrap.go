package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
)

// Version is the Bootstrap schema version this build understands.
const Version = 1

// Limits.
const (
	MaxSize      = 256 << 10 // encoded Bootstrap
	MaxArgs      = 256
	MaxEnv       = 256
	MaxArgBytes  = 64 << 10 // all argv and env bytes together
	MaxStopGrace = 60 * time.Second
	DefaultGrace = 6 * time.Second
	MaxHostname  = 64
	DaemonUID    = 1000
	DaemonGID    = 1000
	RuntimeHome  = "/home/runtime"
	WorkspaceDir = "/environment/workspace"
	defaultPATH  = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Errors, one per rule; test with errors.Is.
var (
	ErrVersion   = errors.New("bootstrap: version must be 1")
	ErrHostname  = errors.New("bootstrap: hostname must be 1 to 64 characters of a-z, 0-9 and '-', not starting or ending with '-'")
	ErrArgv      = errors.New("bootstrap: daemon argv must have 1 to 256 entries, the first an absolute clean path, none containing NUL")
	ErrEnv       = errors.New("bootstrap: daemon env entries must be KEY=VALUE with KEY of A-Z, a-z, 0-9 and '_' not starting with a digit, at most 256, none containing NUL, no KEY twice")
	ErrArgsSize  = errors.New("bootstrap: daemon argv and env together exceed 64 KiB")
	ErrDir       = errors.New("bootstrap: daemon dir must be an absolute clean path without NUL")
	ErrStopGrace = errors.New("bootstrap: stop_grace must be between 0 and 60s")
	ErrDecode    = errors.New("bootstrap: malformed JSON")
	ErrTooLarge  = errors.New("bootstrap: larger than 256 KiB")
)

// Duration is a time.Duration written in JSON as a string like "6s".
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("duration must be a string such as \"6s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("duration must be a string such as \"6s\"")
	}
	*d = Duration(v)
	return nil
}

// Process is a program the guest runs as UID/GID DaemonUID/DaemonGID.
type Process struct {
	Argv []string `json:"argv"`
	// Env is the complete environment as KEY=VALUE; PATH defaults to a
	// scrubbed system PATH and HOME to RuntimeHome when absent.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; default WorkspaceDir when it exists,
	// else RuntimeHome when it exists, else /.
	Dir string `json:"dir,omitempty"`
}

// Bootstrap is what the host sends the guest after Welcome.
type Bootstrap struct {
	Version  int    `json:"version"`
	Hostname string `json:"hostname,omitempty"`
	// Daemon is the long-running service; nil runs nothing (the guest idles).
	Daemon *Process `json:"daemon,omitempty"`
	// StopGrace is how long processes get between SIGTERM and SIGKILL.
	StopGrace *Duration `json:"stop_grace,omitempty"`
}

// Grace returns the stop grace with its default applied.
func (b *Bootstrap) Grace() time.Duration {
	if b.StopGrace == nil {
		return DefaultGrace
	}
	return time.Duration(*b.StopGrace)
}

// Decode reads one Bootstrap strictly: at most MaxSize bytes, no unknown
// fields, no trailing data. It does not validate; call Validate.
func Decode(r io.Reader) (*Bootstrap, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if len(data) > MaxSize {
		return nil, ErrTooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var b Bootstrap
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the object", ErrDecode)
	}
	return &b, nil
}

// safeJSONError describes a decode error without echoing input values.
func safeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q has the wrong type", te.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	}
	return "invalid document"
}

// Validate checks every rule and returns the first that fails.
func (b *Bootstrap) Validate() error {
	if b.Version != Version {
		return ErrVersion
	}
	if b.Hostname != "" && !validHostname(b.Hostname) {
		return ErrHostname
	}
	if b.StopGrace != nil && (*b.StopGrace < 0 || time.Duration(*b.StopGrace) > MaxStopGrace) {
		return ErrStopGrace
	}
	if b.Daemon != nil {
		if err := b.Daemon.Validate(); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	return nil
}

// Validate checks a Process.
func (p *Process) Validate() error {
	if len(p.Argv) == 0 || len(p.Argv) > MaxArgs || !cleanAbs(p.Argv[0]) {
		return ErrArgv
	}
	size := 0
	for _, a := range p.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return ErrArgv
		}
		size += len(a)
	}
	if len(p.Env) > MaxEnv {
		return ErrEnv
	}
	seen := make(map[string]bool, len(p.Env))
	for _, kv := range p.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !validEnvKey(k) || strings.IndexByte(kv, 0) >= 0 || seen[k] {
			return ErrEnv
		}
		seen[k] = true
		size += len(kv)
	}
	if size > MaxArgBytes {
		return ErrArgsSize
	}
	if p.Dir != "" && !cleanAbs(p.Dir) {
		return ErrDir
	}
	return nil
}

// Environ returns the process environment with defaults for PATH and HOME.
func (p *Process) Environ() []string {
	env := append([]string(nil), p.Env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH="+defaultPATH)
	}
	if !has("HOME") {
		env = append(env, "HOME="+RuntimeHome)
	}
	return env
}

func cleanAbs(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && strings.IndexByte(p, 0) < 0
}

func validEnvKey(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func validHostname(h string) bool {
	if len(h) == 0 || len(h) > MaxHostname || h[0] == '-' || h[len(h)-1] == '-' {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
