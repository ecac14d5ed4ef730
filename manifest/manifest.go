package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/oac/sandbox-agent/internal/strictjson"
)

// SchemaVersion is the only schema this package reads and writes.
const SchemaVersion = 1

// MaxSize bounds an encoded manifest.
const MaxSize = 1 << 20

// Limits of the schema.
const (
	MaxArtifacts    = 256
	MaxArtifactSize = 64 << 30
	// MaxMirrors bounds an artifact's mirrors: with its url, at most 8
	// places one file is fetched from.
	MaxMirrors = 7
	// MaxInstallArgs and MaxInstallArgLen bound the installer's arguments.
	MaxInstallArgs   = 16
	MaxInstallArgLen = 128
)

// Kinds of artifacts.
const (
	KindRootfsTar    = "rootfs-tar"    // a rootfs tar.gz for wsl --import
	KindDiskExt4     = "disk-ext4"     // a raw ext4 disk image
	KindDiskErofs    = "disk-erofs"    // a raw erofs disk image
	KindKernel       = "kernel"        // a Linux kernel image (bzImage)
	KindInitramfs    = "initramfs"     // a gzip-compressed newc initramfs
	KindWSLInstaller = "wsl-installer" // the mirrored WSL installer (MSI)
	KindOCILayer     = "oci-layer"     // a gzip OCI layer (the rootfs tar.gz)
)

// Kinds lists every kind, sorted.
var Kinds = []string{KindDiskErofs, KindDiskExt4, KindInitramfs, KindKernel, KindOCILayer, KindRootfsTar, KindWSLInstaller}

// Platforms are the host platforms an artifact is for; Arches the CPU
// architectures.
var (
	Platforms = []string{"darwin", "linux", "windows"}
	Arches    = []string{"amd64", "arm64"}
)

// ErrInvalid is wrapped by every decode and validation error.
var ErrInvalid = errors.New("invalid manifest")

// Manifest pins every artifact a host needs, so the pins move together.
type Manifest struct {
	// Schema is SchemaVersion.
	Schema int `json:"schema"`
	// Release names this set of pins (for example "2026.11.29-1").
	Release string `json:"release"`
	// Artifacts are the pinned files.
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one pinned file.
type Artifact struct {
	// Name is unique in the manifest: 1 to 64 of a-z, 0-9, '.', '_', '-'.
	Name string `json:"name"`
	// Kind is one of Kinds.
	Kind string `json:"kind"`
	// Platform and Arch say which hosts use it.
	Platform string `json:"platform"`
	Arch     string `json:"arch"`
	// URL is where it is downloaded from first: https (plain http only
	// for a loopback host), no user info, query or fragment. Its last
	// path element is the file's name.
	URL string `json:"url"`
	// Mirrors are more places that serve the same bytes, tried in order
	// after URL (optional: 1 to MaxMirrors, each under URL's rule, no
	// two alike). Bytes are accepted from any of them only by SHA256.
	Mirrors []string `json:"mirrors,omitempty"`
	// Size is its exact size in bytes.
	Size int64 `json:"size"`
	// SHA256 is its digest, 64 lowercase hex digits.
	SHA256 string `json:"sha256"`
	// Install says how to run a wsl-installer (optional, that kind
	// only; see InstallPlan for the default).
	Install *Install `json:"install,omitempty"`
}

// Install is how the WSL installer (an MSI) is run: msiexec.exe /i FILE
// followed by Args, and whether Windows must restart before WSL works.
type Install struct {
	// Args follow "msiexec.exe /i FILE": 0 to MaxInstallArgs, each 1 to
	// MaxInstallArgLen of A-Z, a-z, 0-9, '/', '_', '.', '=', ':', ',',
	// '+', '-' (no spaces or quotes: the line is shown to be typed and
	// run as it is).
	Args []string `json:"args"`
	// Restart: Windows must restart after installing, before WSL runs.
	Restart bool `json:"restart"`
}

// MarshalJSON writes no args as [] (the schema has no null).
func (i Install) MarshalJSON() ([]byte, error) {
	type plain Install
	p := plain(i)
	if p.Args == nil {
		p.Args = []string{}
	}
	return json.Marshal(p)
}

// DefaultInstall is the plan of a wsl-installer pinned without one: the
// MSI's own dialog, and a restart (the safe guess: a restart that was not
// needed costs a minute, a missing one leaves WSL unusable).
var DefaultInstall = Install{Args: []string{}, Restart: true}

// InstallPlan is a's Install, or DefaultInstall when the manifest gives
// none.
func (a Artifact) InstallPlan() Install {
	if a.Install == nil {
		return DefaultInstall
	}
	return *a.Install
}

// URLs are a's places in the order they are tried: URL, then Mirrors.
func (a Artifact) URLs() []string {
	return append([]string{a.URL}, a.Mirrors...)
}

// The patterns are compiled on first use, not when oac-shim starts.
var (
	topKeys      = []string{"artifacts", "release", "schema"}
	artifactKeys = []string{"arch", "kind", "name", "platform", "sha256", "size", "url"}
	optionalKeys = []string{"install", "mirrors"}
	installKeys  = []string{"args", "restart"}
	argRE        = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9/_.=:,+-]+$`) })
	nameRE       = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })
	releaseRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`) })
	hexRE        = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })
)

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// Decode reads one manifest strictly: at most MaxSize bytes; exactly the
// schema's keys at every level, each once, in their exact case; no
// trailing data; then Validate. Error messages name the rule and the
// artifact, never a URL or a digest.
func Decode(r io.Reader) (*Manifest, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if len(b) > MaxSize {
		return nil, invalid("larger than %d bytes", MaxSize)
	}
	if err := checkShape(b); err != nil {
		return nil, err
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, invalid("%s", jsonErr(err))
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// jsonErr describes a decoding error without the offending value.
func jsonErr(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q has the wrong type (want %s)", te.Field, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("not valid JSON at offset %d", se.Offset)
	}
	return "not a manifest object"
}

// shape is the manifest's shape: an object with exactly topKeys,
// "artifacts" an array of at most MaxArtifacts objects with every one of
// artifactKeys and maybe optionalKeys ("mirrors" an array of at most
// MaxMirrors, "install" an object with exactly installKeys, its "args" at
// most MaxInstallArgs); the values' types are encoding/json's to check.
var shape = &strictjson.Schema{Kind: strictjson.Object, RequireAll: true, Fields: fields(topKeys, nil, map[string]*strictjson.Schema{
	"artifacts": {Kind: strictjson.Array, MaxItems: MaxArtifacts, Elem: &strictjson.Schema{
		Kind: strictjson.Object, Fields: fields(artifactKeys, optionalKeys, map[string]*strictjson.Schema{
			"mirrors": {Kind: strictjson.Array, MaxItems: MaxMirrors},
			"install": {Kind: strictjson.Object, RequireAll: true, Fields: fields(installKeys, nil, map[string]*strictjson.Schema{
				"args": {Kind: strictjson.Array, MaxItems: MaxInstallArgs},
			})},
		}),
	}},
})}

// fields lists required then optional keys with their schemas.
func fields(required, optional []string, schemas map[string]*strictjson.Schema) []strictjson.Field {
	var fs []strictjson.Field
	for _, k := range required {
		fs = append(fs, strictjson.Field{Name: k, Schema: schemas[k], Required: true})
	}
	for _, k := range optional {
		fs = append(fs, strictjson.Field{Name: k, Schema: schemas[k]})
	}
	return fs
}

// checkShape walks the document (package internal/strictjson): the shape,
// no duplicate keys, keys in their exact case, nothing after the value.
func checkShape(b []byte) error {
	err := strictjson.Check(b, shape)
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return err
	}
	// Inside an artifact, say which one and which member of it
	// ("artifact 2: install: ...").
	where := ""
	if rest, ok := strings.CutPrefix(e.Path, "artifacts[]"); ok {
		where = fmt.Sprintf("artifact %d: ", e.Index)
		if rest = strings.TrimPrefix(rest, "."); rest != "" {
			where += strings.ReplaceAll(rest, ".", ": ") + ": "
		}
	}
	switch {
	case errors.Is(err, strictjson.ErrDuplicate):
		return invalid("%sduplicate key %q", where, truncate(e.Key))
	case errors.Is(err, strictjson.ErrUnknown), errors.Is(err, strictjson.ErrCase):
		if where == "" {
			return invalid("unknown key %q at the top level (keys are case-sensitive)", truncate(e.Key))
		}
		return invalid("%sunknown key %q (keys are case-sensitive)", where, truncate(e.Key))
	case errors.Is(err, strictjson.ErrMissing):
		return invalid("%smissing key %q", where, e.Key)
	case errors.Is(err, strictjson.ErrType) && e.Path == "" && e.Key == "":
		return invalid("the top level must be an object")
	case errors.Is(err, strictjson.ErrType) && e.Key == "artifacts":
		return invalid("artifacts must be an array")
	case errors.Is(err, strictjson.ErrType) && e.Key == "":
		return invalid("artifact %d must be an object", e.Index)
	case errors.Is(err, strictjson.ErrType) && (e.Key == "install"):
		return invalid("%sinstall must be an object", where)
	case errors.Is(err, strictjson.ErrType):
		return invalid("%s%s must be an array", where, e.Key)
	case errors.Is(err, strictjson.ErrTooMany) && strings.HasSuffix(e.Path, ".mirrors"):
		return invalid("%smore than %d mirrors", strings.TrimSuffix(where, "mirrors: "), MaxMirrors)
	case errors.Is(err, strictjson.ErrTooMany) && strings.HasSuffix(e.Path, ".args"):
		return invalid("%smore than %d args", strings.TrimSuffix(where, "args: "), MaxInstallArgs)
	case errors.Is(err, strictjson.ErrTooMany):
		return invalid("more than %d artifacts", MaxArtifacts)
	case errors.Is(err, strictjson.ErrDepth):
		return invalid("nested too deeply")
	case errors.Is(err, strictjson.ErrTrailing):
		return invalid("trailing data after the manifest")
	}
	return invalid("not valid JSON")
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// Validate checks every rule of the schema.
func (m *Manifest) Validate() error {
	if m.Schema != SchemaVersion {
		return invalid("schema %d is not supported (this oac-image reads schema %d)", m.Schema, SchemaVersion)
	}
	if !releaseRE().MatchString(m.Release) {
		return invalid("release must be 1 to 64 of A-Z, a-z, 0-9, '.', '_', '+', '-'")
	}
	if len(m.Artifacts) == 0 || len(m.Artifacts) > MaxArtifacts {
		return invalid("want 1 to %d artifacts", MaxArtifacts)
	}
	names := map[string]bool{}
	slots := map[[3]string]string{}
	for i, a := range m.Artifacts {
		where := fmt.Sprintf("artifact %d", i)
		if !nameRE().MatchString(a.Name) {
			return invalid("%s: name must be 1 to 64 of a-z, 0-9, '.', '_', '-'", where)
		}
		where = fmt.Sprintf("artifact %q", a.Name)
		if names[a.Name] {
			return invalid("%s: the name is used twice", where)
		}
		names[a.Name] = true
		if !slices.Contains(Kinds, a.Kind) {
			return invalid("%s: kind must be one of %s", where, strings.Join(Kinds, ", "))
		}
		if !slices.Contains(Platforms, a.Platform) {
			return invalid("%s: platform must be one of %s", where, strings.Join(Platforms, ", "))
		}
		if !slices.Contains(Arches, a.Arch) {
			return invalid("%s: arch must be one of %s", where, strings.Join(Arches, ", "))
		}
		slot := [3]string{a.Kind, a.Platform, a.Arch}
		if other, ok := slots[slot]; ok {
			return invalid("%s: %s for %s/%s is already pinned by %q", where, a.Kind, a.Platform, a.Arch, other)
		}
		slots[slot] = a.Name
		if err := CheckURL(a.URL); err != nil {
			return invalid("%s: %v", where, err)
		}
		if err := checkMirrors(a); err != nil {
			return invalid("%s: %v", where, err)
		}
		if err := checkInstall(a); err != nil {
			return invalid("%s: %v", where, err)
		}
		if a.Size < 1 || a.Size > MaxArtifactSize {
			return invalid("%s: size must be 1 to %d bytes", where, int64(MaxArtifactSize))
		}
		if !hexRE().MatchString(a.SHA256) || a.SHA256 == strings.Repeat("0", 64) {
			return invalid("%s: sha256 must be 64 lowercase hex digits, not all zero", where)
		}
	}
	return nil
}

// checkMirrors: absent, or 1 to MaxMirrors URLs under URL's rule, none
// repeating another or the url. Errors say which by position, never the
// URL.
func checkMirrors(a Artifact) error {
	if a.Mirrors == nil {
		return nil
	}
	if len(a.Mirrors) == 0 || len(a.Mirrors) > MaxMirrors {
		return fmt.Errorf("mirrors must list 1 to %d URLs (or be left out)", MaxMirrors)
	}
	seen := map[string]bool{a.URL: true}
	for i, m := range a.Mirrors {
		if err := CheckURL(m); err != nil {
			return fmt.Errorf("mirror %d: %v", i, err)
		}
		if seen[m] {
			return fmt.Errorf("mirror %d: the same URL is listed twice", i)
		}
		seen[m] = true
	}
	return nil
}

// checkInstall: install only on a wsl-installer; its args bounded and
// plain (no spaces, quotes or shell characters).
func checkInstall(a Artifact) error {
	if a.Install == nil {
		return nil
	}
	if a.Kind != KindWSLInstaller {
		return fmt.Errorf("install is only for kind %s", KindWSLInstaller)
	}
	if len(a.Install.Args) > MaxInstallArgs {
		return fmt.Errorf("install: more than %d args", MaxInstallArgs)
	}
	for i, arg := range a.Install.Args {
		if len(arg) > MaxInstallArgLen || !argRE().MatchString(arg) {
			return fmt.Errorf("install: arg %d must be 1 to %d of A-Z, a-z, 0-9, '/', '_', '.', '=', ':', ',', '+', '-'", i, MaxInstallArgLen)
		}
	}
	return nil
}

// CheckURL applies the URL rule: https, or http for a loopback host only;
// a host; no user info, query or fragment; no whitespace or control
// characters. The error does not echo the URL.
func CheckURL(raw string) error {
	if raw == "" || len(raw) > 2048 {
		return errors.New("url must be 1 to 2048 bytes")
	}
	for _, r := range raw {
		if r <= ' ' || r == 0x7f {
			return errors.New("url must not contain whitespace or control characters")
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("url does not parse")
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#") {
		return errors.New("url must have no user info, query or fragment")
	}
	if u.Host == "" || u.Opaque != "" {
		return errors.New("url must have a host")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopback(u.Hostname()) {
			return errors.New("url must be https (plain http only for a loopback host)")
		}
	default:
		return errors.New("url must be https (plain http only for a loopback host)")
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Encode writes m as indented JSON with a final newline, artifacts in the
// order given. It validates m first.
func Encode(m *Manifest, w io.Writer) error {
	if err := m.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Find returns the artifacts matching the non-empty filters, in manifest
// order.
func (m *Manifest) Find(name, kind, platform, arch string) []Artifact {
	var out []Artifact
	for _, a := range m.Artifacts {
		if (name == "" || a.Name == name) && (kind == "" || a.Kind == kind) &&
			(platform == "" || a.Platform == platform) && (arch == "" || a.Arch == arch) {
			out = append(out, a)
		}
	}
	return out
}

// Sort orders artifacts by name (writers use it for stable output).
func (m *Manifest) Sort() {
	sort.Slice(m.Artifacts, func(i, j int) bool { return m.Artifacts[i].Name < m.Artifacts[j].Name })
}
