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

	"github.com/oac/sandbox-agent/internal/strictjson"
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
	ErrVersion   = rule("bootstrap: version must be 1")
	ErrHostname  = rule("bootstrap: hostname must be 1 to 64 characters of a-z, 0-9 and '-', not starting or ending with '-'")
	ErrArgv      = rule("bootstrap: daemon argv must have 1 to 256 entries, the first an absolute clean path, none containing NUL")
	ErrEnv       = rule("bootstrap: daemon env entries must be KEY=VALUE with KEY of A-Z, a-z, 0-9 and '_' not starting with a digit, at most 256, none containing NUL, no KEY twice")
	ErrArgsSize  = rule("bootstrap: daemon argv and env together exceed 64 KiB")
	ErrDir       = rule("bootstrap: daemon dir must be an absolute clean path without NUL")
	ErrStopGrace = rule("bootstrap: stop_grace must be between 0 and 60s")
	ErrDecode    = rule("bootstrap: malformed JSON")
	ErrTooLarge  = rule("bootstrap: larger than 256 KiB")

	ErrDuplicateKey = rule("bootstrap: a key appears more than once in one object")
	ErrUnknownKey   = rule("bootstrap: unknown key (keys are lowercase and exactly as documented)")

	ErrNoIdentity       = rule("bootstrap: sandbox_io needs the sandbox's own tenant, environment and allocation (oac-shim run --tenant, --environment, --allocation)")
	ErrIdentity         = rule("bootstrap: sandbox tenant_id, environment_id and allocation_id must be canonical lowercase non-zero UUIDs")
	ErrSandboxIOPath    = rule("bootstrap: sandbox_io.path must be an absolute clean path without NUL")
	ErrIdentityMismatch = rule("bootstrap: the sandbox identity differs from the one the host gives (oac-shim run --tenant, --environment, --allocation)")
	ErrSandboxIOSource  = rule("bootstrap: sandbox_io needs exactly one of bootstrap (the guest writes the file) and provided (the provider placed it)")

	ErrCredentialsNeedDaemon = rule("bootstrap: credentials need a daemon")
	ErrUsername              = rule("bootstrap: credentials.username must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-'")
	ErrPassword              = rule("bootstrap: credentials.password must be empty (oac-shim generates one) or 16 to 1024 printable ASCII characters without spaces")
	ErrPasswordMissing       = rule("bootstrap: credentials.password is empty: the host must generate one before sending the bootstrap")
	ErrCredentialEnv         = rule("bootstrap: credentials.username_env and password_env must be two different valid environment variable names not set in daemon.env")

	ErrHealthNeedsCredentials = rule("bootstrap: health needs a daemon and credentials (the check uses HTTP Basic auth)")
	ErrHealthPort             = rule("bootstrap: health.port must be between 1 and 65535")
	ErrHealthPath             = rule("bootstrap: health.path must be an absolute URL path of at most 256 bytes without whitespace, control characters or fragment")
	ErrHealthInterval         = rule("bootstrap: health.interval must be more than 0 and at most 10s")
	ErrHealthTimeout          = rule("bootstrap: health.timeout must be more than 0 and at most 60s")
	ErrHealthDeadline         = rule("bootstrap: health.deadline must be more than 0 and at most 10m")
)

// Health check defaults and bounds (docs/contract.md, "The daemon": GET
// /global/health with Basic auth, 3 s per request, polled every 100 ms,
// given up after 30 s).
const (
	DefaultHealthPath     = "/global/health"
	DefaultHealthInterval = 100 * time.Millisecond
	DefaultHealthTimeout  = 3 * time.Second
	DefaultHealthDeadline = 30 * time.Second
	MaxHealthInterval     = 10 * time.Second
	MaxHealthTimeout      = 60 * time.Second
	MaxHealthDeadline     = 10 * time.Minute
	MaxHealthPath         = 256
	// HealthHost is where the agent reaches the daemon: the guest's own
	// loopback (the host cannot reach the guest's network).
	HealthHost = "127.0.0.1"
	// DefaultUsername is the Basic auth user when credentials name none.
	DefaultUsername = "runtime"
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

// Identity names the sandbox itself. The host knows it (oac-shim run
// --tenant, --environment, --allocation); a SandboxIO resource must name it.
// A sandbox with an identity is hosted: it needs oac-sandbox-io and a TLS,
// non-loopback link URL.
type Identity struct {
	TenantID      string `json:"tenant_id"`
	EnvironmentID string `json:"environment_id"`
	AllocationID  string `json:"allocation_id"`
	// AllowLoopbackLink accepts a ws:// or wss:// link URL on a loopback
	// host (development against a local Link relay). It is the operator's
	// (oac-shim run --allow-loopback-link), never the document's: it is not
	// part of the schema (a bootstrap naming it is refused as an unknown
	// key), and the host tells the guest in Welcome.
	AllowLoopbackLink bool `json:"-"`
}

// Validate checks the identity's own format.
func (id *Identity) Validate() error {
	if !ValidUUID(id.TenantID) || !ValidUUID(id.EnvironmentID) || !ValidUUID(id.AllocationID) {
		return ErrIdentity
	}
	return nil
}

// SandboxIOSpec says how the guest starts oac-sandbox-io.
type SandboxIOSpec struct {
	// Path is the binary; default SandboxIOPath.
	Path string `json:"path,omitempty"`
	// Bootstrap is the private file's content; the guest writes it to
	// SandboxIOFile. Decoded strictly (see DecodeSandboxIO).
	Bootstrap *SandboxIO `json:"bootstrap,omitempty"`
	// Provided says the provider already placed SandboxIOFile (containers
	// copy it in before start): the guest reads and validates it instead.
	Provided bool `json:"provided,omitempty"`
}

// BinaryPath returns Path with its default applied.
func (s *SandboxIOSpec) BinaryPath() string {
	if s.Path == "" {
		return SandboxIOPath
	}
	return s.Path
}

// Credentials are the daemon's HTTP Basic credentials and the names of the
// environment variables it reads them from. They are added to the daemon's
// environment and nowhere else: never argv, events, logs or URLs.
type Credentials struct {
	// Username defaults to DefaultUsername.
	Username string `json:"username,omitempty"`
	// Password empty: oac-shim generates a random one per start.
	Password    string `json:"password,omitempty"`
	UsernameEnv string `json:"username_env"`
	PasswordEnv string `json:"password_env"`
}

// User returns Username with its default applied.
func (c *Credentials) User() string {
	if c.Username == "" {
		return DefaultUsername
	}
	return c.Username
}

// Health is how the guest decides the daemon is up: GET Path on
// http://HealthHost:Port with Basic auth every Interval, each request
// bounded by Timeout, until a 2xx answer or Deadline after the start.
type Health struct {
	Port     int       `json:"port"`
	Path     string    `json:"path,omitempty"`
	Interval *Duration `json:"interval,omitempty"`
	Timeout  *Duration `json:"timeout,omitempty"`
	Deadline *Duration `json:"deadline,omitempty"`
}

func durOr(d *Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return time.Duration(*d)
}

// URLPath returns Path with its default applied.
func (h *Health) URLPath() string {
	if h.Path == "" {
		return DefaultHealthPath
	}
	return h.Path
}

// BaseURL is the daemon's URL inside the guest, as reported in ready.
func (h *Health) BaseURL() string { return fmt.Sprintf("http://%s:%d", HealthHost, h.Port) }

// Every returns the poll interval with its default applied.
func (h *Health) Every() time.Duration { return durOr(h.Interval, DefaultHealthInterval) }

// PerRequest returns the per-request timeout with its default applied.
func (h *Health) PerRequest() time.Duration { return durOr(h.Timeout, DefaultHealthTimeout) }

// GiveUpAfter returns the overall deadline with its default applied.
func (h *Health) GiveUpAfter() time.Duration { return durOr(h.Deadline, DefaultHealthDeadline) }

// Bootstrap is what the host sends the guest after Welcome.
type Bootstrap struct {
	Version  int    `json:"version"`
	Hostname string `json:"hostname,omitempty"`
	// Sandbox is the sandbox's own identity; set when it is hosted.
	Sandbox *Identity `json:"sandbox,omitempty"`
	// SandboxIO starts oac-sandbox-io first; nil starts none.
	SandboxIO *SandboxIOSpec `json:"sandbox_io,omitempty"`
	// Daemon is the long-running service; nil runs nothing (the guest idles).
	Daemon *Process `json:"daemon,omitempty"`
	// Credentials for the daemon's HTTP Basic auth.
	Credentials *Credentials `json:"credentials,omitempty"`
	// Health is polled before the guest reports ready; nil: ready once
	// everything started.
	Health *Health `json:"health,omitempty"`
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

// Decode reads one Bootstrap strictly: at most MaxSize bytes, exactly the
// documented keys (no unknown, case-variant or repeated keys at any level),
// no trailing data; the sandbox_io bootstrap by DecodeSandboxIO's rules. It
// does not validate; call Validate.
func Decode(r io.Reader) (*Bootstrap, error) {
	var b Bootstrap
	if err := decodeStrict(r, bootstrapSchema, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// decodeStrict reads one JSON object into v (a pointer to a struct) by
// Decode's rules: at most MaxSize bytes, the exact keys of v's type at
// every level, none twice, no trailing data.
func decodeStrict(r io.Reader, s *strictjson.Schema, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if len(data) > MaxSize {
		return ErrTooLarge
	}
	if err := checkKeys(data, s); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if isSandboxIOError(err) {
			return err
		}
		return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
	}
	return nil
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
		return "unknown field" // the name is input: not echoed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	}
	return "invalid document"
}

// Validate checks every rule and returns the first that fails. An empty
// credentials.password passes (the host generates one); the guest calls
// ValidateInGuest, which refuses it.
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
	if b.Sandbox != nil {
		if err := b.Sandbox.Validate(); err != nil {
			return err
		}
		if b.SandboxIO == nil {
			return ErrNoLink
		}
	}
	if s := b.SandboxIO; s != nil {
		if s.Path != "" && !cleanAbs(s.Path) {
			return ErrSandboxIOPath
		}
		if (s.Bootstrap == nil) == !s.Provided {
			return ErrSandboxIOSource
		}
		if b.Sandbox == nil {
			return ErrNoIdentity
		}
		if s.Bootstrap != nil {
			if err := s.Bootstrap.Validate(b.Sandbox); err != nil {
				return err
			}
		}
	}
	if b.Daemon != nil {
		if err := b.Daemon.Validate(); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	if c := b.Credentials; c != nil {
		if b.Daemon == nil {
			return ErrCredentialsNeedDaemon
		}
		if c.Username != "" && !validUsername(c.Username) {
			return ErrUsername
		}
		if c.Password != "" && !validPassword(c.Password) {
			return ErrPassword
		}
		if !validEnvKey(c.UsernameEnv) || !validEnvKey(c.PasswordEnv) || c.UsernameEnv == c.PasswordEnv {
			return ErrCredentialEnv
		}
		for _, kv := range b.Daemon.Env {
			k, _, _ := strings.Cut(kv, "=")
			if k == c.UsernameEnv || k == c.PasswordEnv {
				return ErrCredentialEnv
			}
		}
	}
	if h := b.Health; h != nil {
		if b.Daemon == nil || b.Credentials == nil {
			return ErrHealthNeedsCredentials
		}
		if h.Port < 1 || h.Port > 65535 {
			return ErrHealthPort
		}
		if h.Path != "" && !validHealthPath(h.Path) {
			return ErrHealthPath
		}
		if d := h.Every(); d <= 0 || d > MaxHealthInterval {
			return ErrHealthInterval
		}
		if d := h.PerRequest(); d <= 0 || d > MaxHealthTimeout {
			return ErrHealthTimeout
		}
		if d := h.GiveUpAfter(); d <= 0 || d > MaxHealthDeadline {
			return ErrHealthDeadline
		}
	}
	return nil
}

// ValidateInGuest is Validate plus what only the guest requires: a
// password (the host generated it if the bootstrap had none).
func (b *Bootstrap) ValidateInGuest() error {
	if err := b.Validate(); err != nil {
		return err
	}
	if b.Credentials != nil && b.Credentials.Password == "" {
		return ErrPasswordMissing
	}
	return nil
}

// DaemonEnviron returns the daemon's environment: Process.Environ plus the
// credentials under their variable names.
func (b *Bootstrap) DaemonEnviron() []string {
	env := b.Daemon.Environ()
	if c := b.Credentials; c != nil {
		env = append(env, c.UsernameEnv+"="+c.User(), c.PasswordEnv+"="+c.Password)
	}
	return env
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

func validUsername(u string) bool {
	if len(u) == 0 || len(u) > 64 {
		return false
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		if !(c == '.' || c == '_' || c == '-' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// The daemon's password is MinPassword to MaxPassword printable ASCII
// characters without spaces, wherever it comes from (the bootstrap, or
// the caller on oac-shim's stdin).
const (
	MinPassword = 16
	MaxPassword = 1024
)

// ValidPassword reports whether p follows the password rules.
func ValidPassword(p string) bool { return validPassword(p) }

func validPassword(p string) bool {
	if len(p) < MinPassword || len(p) > MaxPassword {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] <= 0x20 || p[i] >= 0x7f {
			return false
		}
	}
	return true
}

func validHealthPath(p string) bool {
	if len(p) > MaxHealthPath || !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= 0x20 || c >= 0x7f || c == '#' {
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

// ErrInvalid is matched (errors.Is) by every rule error of this package:
// whatever rule failed, the bootstrap is invalid and nothing should be
// created. Callers that need the rule test for its own sentinel.
var ErrInvalid = errors.New("bootstrap: invalid")

// ruleError is one rule's sentinel; it is also ErrInvalid.
type ruleError struct{ msg string }

func rule(msg string) error { return &ruleError{msg} }

func (e *ruleError) Error() string { return e.msg }

// Is makes every rule error match ErrInvalid.
func (e *ruleError) Is(target error) bool { return target == ErrInvalid }
