package bootstrap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/oac/sandbox-agent/internal/strictjson"
)

// Contract values of oac-sandbox-io (docs/contract.md).
const (
	// SandboxIOVersion is the version of the private bootstrap file.
	SandboxIOVersion = 1
	// MaxSandboxIOSize bounds the private bootstrap file.
	MaxSandboxIOSize = 16 << 10
	// MaxCredential bounds the Link credential.
	MaxCredential = 4096
	// MaxLinkURL bounds the Link URL.
	MaxLinkURL = 2048
	// SandboxIOPath is where every guest image installs oac-sandbox-io.
	SandboxIOPath = "/usr/local/bin/oac-sandbox-io"
	// SandboxIOFile is the private bootstrap file oac-sandbox-io reads.
	SandboxIOFile = RuntimeHome + "/sandbox-io-bootstrap.json"
	// KindAllocation is the resource kind of a hosted sandbox.
	KindAllocation = "allocation"
)

// SandboxIOArgv is oac-sandbox-io's command line, exactly.
func SandboxIOArgv(path string) []string {
	return []string{path, "--bootstrap-file", SandboxIOFile}
}

// Errors of the private bootstrap file, one per rule; test with errors.Is.
// Messages name the rule and never echo the submitted value.
var (
	ErrSandboxIOTooLarge     = rule("sandbox_io bootstrap: larger than 16 KiB")
	ErrSandboxIOSyntax       = rule("sandbox_io bootstrap: not a single well-formed JSON object in UTF-8")
	ErrSandboxIOTrailing     = rule("sandbox_io bootstrap: trailing data after the JSON object")
	ErrSandboxIODuplicateKey = rule("sandbox_io bootstrap: a key appears more than once in one object")
	ErrSandboxIOKeyCase      = rule("sandbox_io bootstrap: a key differs from the contract only in letter case (keys are lowercase)")
	ErrSandboxIOUnknownKey   = rule("sandbox_io bootstrap: unknown key (allowed: version, link_url, credential, resource{tenant_id, environment_id, kind, id, generation})")
	ErrSandboxIOMissingKey   = rule("sandbox_io bootstrap: a required key is missing (every key of the contract is required)")
	ErrSandboxIOType         = rule("sandbox_io bootstrap: a value has the wrong JSON type (version and generation are integers, resource an object, the rest strings)")
	ErrSandboxIOVersion      = rule("sandbox_io bootstrap: version must be 1")

	ErrNoLink               = rule("sandbox_io: a hosted sandbox needs a link_url and there is none")
	ErrPublicURLUnreachable = rule("sandbox_io: link_url must be TLS (wss) and not a loopback host for a hosted sandbox")
	ErrLinkURL              = rule("sandbox_io: link_url must be an absolute URL with a host, at most 2048 bytes")
	ErrLinkURLScheme        = rule("sandbox_io: link_url scheme must be wss (plain ws only for a loopback host)")
	ErrLinkURLUserInfo      = rule("sandbox_io: link_url must not carry user info")
	ErrLinkURLQuery         = rule("sandbox_io: link_url must not have a query")
	ErrLinkURLFragment      = rule("sandbox_io: link_url must not have a fragment")
	ErrLinkURLWhitespace    = rule("sandbox_io: link_url must not contain whitespace or control characters")
	ErrCredentialLength     = rule("sandbox_io: credential must be 1 to 4096 bytes")
	ErrCredentialChars      = rule("sandbox_io: credential must not contain whitespace or NUL")
	ErrTenantID             = rule("sandbox_io: resource.tenant_id must be a canonical lowercase non-zero UUID")
	ErrEnvironmentID        = rule("sandbox_io: resource.environment_id must be a canonical lowercase non-zero UUID")
	ErrAllocationID         = rule("sandbox_io: resource.id must be a canonical lowercase non-zero UUID")
	ErrResourceKind         = rule("sandbox_io: resource.kind must be \"allocation\" for a hosted sandbox")
	ErrGeneration           = rule("sandbox_io: resource.generation must be an integer of at least 1")
	ErrWrongTenant          = rule("sandbox_io: resource.tenant_id does not name this sandbox's tenant")
	ErrWrongEnvironment     = rule("sandbox_io: resource.environment_id does not name this sandbox's environment")
	ErrWrongAllocation      = rule("sandbox_io: resource.id does not name this sandbox's allocation")
)

// Resource names what oac-sandbox-io serves.
type Resource struct {
	TenantID      string `json:"tenant_id"`
	EnvironmentID string `json:"environment_id"`
	Kind          string `json:"kind"`
	ID            string `json:"id"`
	Generation    int64  `json:"generation"`
}

// SandboxIO is the content of the private bootstrap file, version 1, as
// docs/contract.md gives it. It decodes only strictly (DecodeSandboxIO) and
// encodes canonically: compact, keys in contract order.
type SandboxIO struct {
	Version    int      `json:"version"`
	LinkURL    string   `json:"link_url"`
	Credential string   `json:"credential"`
	Resource   Resource `json:"resource"`
}

// UnmarshalJSON decodes strictly; see DecodeSandboxIO.
func (s *SandboxIO) UnmarshalJSON(b []byte) error {
	v, err := DecodeSandboxIO(b)
	if err != nil {
		return err
	}
	*s = *v
	return nil
}

// MarshalJSON encodes canonically.
func (s SandboxIO) MarshalJSON() ([]byte, error) { return s.Encode() }

// Encode returns the canonical file content: compact JSON, keys in
// contract order, no trailing newline, HTML characters not escaped.
func (s SandboxIO) Encode() ([]byte, error) {
	type plain SandboxIO // no methods: no recursion
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(plain(s)); err != nil {
		return nil, fmt.Errorf("encode sandbox_io bootstrap: %w", err)
	}
	out := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(out) > MaxSandboxIOSize {
		return nil, ErrSandboxIOTooLarge
	}
	return out, nil
}

// CredentialDigest is what a host stores instead of the credential: the hex
// SHA-256 of the trimmed value.
func CredentialDigest(credential string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(credential)))
	return hex.EncodeToString(sum[:])
}

// sandboxIOSchema is the file's shape: every key of the contract
// required (link_url first: its absence is ErrNoLink).
var sandboxIOSchema = &strictjson.Schema{Kind: strictjson.Object, RequireAll: true, Fields: []strictjson.Field{
	{Name: "link_url", Schema: &strictjson.Schema{Kind: strictjson.String}},
	{Name: "version", Schema: &strictjson.Schema{Kind: strictjson.Int}},
	{Name: "credential", Schema: &strictjson.Schema{Kind: strictjson.String}},
	{Name: "resource", Schema: &strictjson.Schema{Kind: strictjson.Object, RequireAll: true, Fields: []strictjson.Field{
		{Name: "tenant_id", Schema: &strictjson.Schema{Kind: strictjson.String}},
		{Name: "environment_id", Schema: &strictjson.Schema{Kind: strictjson.String}},
		{Name: "kind", Schema: &strictjson.Schema{Kind: strictjson.String}},
		{Name: "id", Schema: &strictjson.Schema{Kind: strictjson.String}},
		{Name: "generation", Schema: &strictjson.Schema{Kind: strictjson.Int}},
	}}},
}}

// DecodeSandboxIO decodes the private bootstrap file strictly: at most
// MaxSandboxIOSize bytes of UTF-8, exactly one JSON object with exactly the
// contract's keys at every level, each once, no unknown or case-variant
// keys, integers where the contract has integers, and nothing after the
// object but whitespace (package internal/strictjson's walk). It does not
// check the values' rules: call Validate.
func DecodeSandboxIO(data []byte) (*SandboxIO, error) {
	if len(data) > MaxSandboxIOSize {
		return nil, ErrSandboxIOTooLarge
	}
	if !utf8.Valid(data) {
		return nil, ErrSandboxIOSyntax
	}
	if err := strictjson.Check(data, sandboxIOSchema); err != nil {
		return nil, sandboxIOError(err)
	}
	type plain SandboxIO // no methods: no recursion
	var s plain
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, ErrSandboxIOType
	}
	if s.Version < 0 || s.Version > 1<<20 {
		return nil, ErrSandboxIOVersion
	}
	return (*SandboxIO)(&s), nil
}

// sandboxIOError is the file's error for the walker's refusal.
func sandboxIOError(err error) error {
	var e *strictjson.Error
	errors.As(err, &e)
	switch {
	case errors.Is(err, strictjson.ErrTrailing):
		return ErrSandboxIOTrailing
	case errors.Is(err, strictjson.ErrDuplicate):
		return ErrSandboxIODuplicateKey
	case errors.Is(err, strictjson.ErrCase):
		return ErrSandboxIOKeyCase
	case errors.Is(err, strictjson.ErrUnknown):
		return ErrSandboxIOUnknownKey
	case errors.Is(err, strictjson.ErrMissing) && e.Path == "" && e.Key == "link_url":
		return ErrNoLink
	case errors.Is(err, strictjson.ErrMissing):
		return ErrSandboxIOMissingKey
	case errors.Is(err, strictjson.ErrType):
		return ErrSandboxIOType
	}
	return ErrSandboxIOSyntax
}

// Validate checks the file's value rules against the sandbox's own
// identity. A nil identity fails: the resource must name this sandbox.
func (s *SandboxIO) Validate(id *Identity) error {
	if s.Version != SandboxIOVersion {
		return ErrSandboxIOVersion
	}
	if err := ValidateLinkURL(s.LinkURL, id == nil || !id.AllowLoopbackLink); err != nil {
		return err
	}
	if len(s.Credential) == 0 || len(s.Credential) > MaxCredential {
		return ErrCredentialLength
	}
	if strings.ContainsFunc(s.Credential, func(r rune) bool { return r == 0 || unicode.IsSpace(r) }) {
		return ErrCredentialChars
	}
	r := s.Resource
	if !ValidUUID(r.TenantID) {
		return ErrTenantID
	}
	if !ValidUUID(r.EnvironmentID) {
		return ErrEnvironmentID
	}
	if r.Kind != KindAllocation {
		return ErrResourceKind
	}
	if !ValidUUID(r.ID) {
		return ErrAllocationID
	}
	if r.Generation < 1 {
		return ErrGeneration
	}
	if id == nil {
		return ErrNoIdentity
	}
	if r.TenantID != id.TenantID {
		return ErrWrongTenant
	}
	if r.EnvironmentID != id.EnvironmentID {
		return ErrWrongEnvironment
	}
	if r.ID != id.AllocationID {
		return ErrWrongAllocation
	}
	return nil
}

// ValidateLinkURL checks a Link URL. hosted refuses plain ws and loopback
// hosts (ErrPublicURLUnreachable); otherwise ws is allowed for a loopback
// host only.
func ValidateLinkURL(raw string, hosted bool) error {
	if raw == "" {
		return ErrNoLink
	}
	if len(raw) > MaxLinkURL {
		return ErrLinkURL
	}
	if strings.ContainsFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return ErrLinkURLWhitespace
	}
	var secure bool
	switch {
	case strings.HasPrefix(raw, "wss://"):
		secure = true
	case strings.HasPrefix(raw, "ws://"):
	default:
		return ErrLinkURLScheme
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return ErrLinkURL
	}
	if u.User != nil {
		return ErrLinkURLUserInfo
	}
	if u.RawQuery != "" || u.ForceQuery {
		return ErrLinkURLQuery
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return ErrLinkURLFragment
	}
	host := u.Hostname()
	if host == "" || !validURLHost(host) {
		return ErrLinkURL
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return ErrLinkURL
		}
	}
	loopback := isLoopbackHost(host)
	if hosted && (!secure || loopback) {
		return ErrPublicURLUnreachable
	}
	if !secure && !loopback {
		return ErrLinkURLScheme
	}
	return nil
}

// validURLHost accepts an IP literal or a DNS name; a host of digits and
// dots that is not a dotted-quad IPv4 address (127.1, 2130706433) is
// refused, because resolvers disagree on what it means.
func validURLHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if strings.Trim(h, "0123456789.") == "" {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}

func isLoopbackHost(h string) bool {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	if a, err := netip.ParseAddr(h); err == nil {
		a = a.Unmap()
		return a.IsLoopback() || a.IsUnspecified()
	}
	return false
}

// ValidUUID reports whether s is a canonical lowercase UUID
// (8-4-4-4-12 hex digits) that is not all zeros.
func ValidUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	zero := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		default:
			return false
		}
		if c != '0' {
			zero = false
		}
	}
	return !zero
}
