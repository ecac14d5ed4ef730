package bootstrap

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	tenant    = "0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21"
	env       = "1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32"
	alloc     = "2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43"
	other     = "3e8bac8d-6f4a-4b52-8dbe-af9a8b7c6d54"
	secret    = "SECRET-credential-value"
	secretPwd = "SECRET-password-0123456789"
)

// validDoc is a valid bootstrap exercising every section.
func validDoc() *Bootstrap {
	grace := Duration(2 * time.Second)
	return &Bootstrap{
		Version:  1,
		Hostname: "demo",
		Sandbox:  &Identity{TenantID: tenant, EnvironmentID: env, AllocationID: alloc},
		SandboxIO: &SandboxIOSpec{Bootstrap: &SandboxIO{
			Version: 1, LinkURL: "wss://link.example.com/api/v1/sandbox-link", Credential: secret,
			Resource: Resource{TenantID: tenant, EnvironmentID: env, Kind: "allocation", ID: alloc, Generation: 1},
		}},
		Daemon:      &Process{Argv: []string{"/usr/bin/server", "serve", "--port", "4096"}, Env: []string{"XDG_STATE_HOME=/home/runtime/.state"}},
		Credentials: &Credentials{Username: "runtime", Password: secretPwd, UsernameEnv: "OAC_SERVER_USERNAME", PasswordEnv: "OAC_SERVER_PASSWORD"},
		Health:      &Health{Port: 4096},
		StopGrace:   &grace,
	}
}

func dur(d time.Duration) *Duration { v := Duration(d); return &v }

func TestValidBootstrapRoundTripsAndValidates(t *testing.T) {
	b := validDoc()
	require.NoError(t, b.Validate())
	require.NoError(t, b.ValidateInGuest())
	data, err := json.Marshal(b)
	require.NoError(t, err)
	got, err := Decode(strings.NewReader(string(data)))
	require.NoError(t, err)
	assert.Equal(t, b, got)
	assert.Equal(t, "http://127.0.0.1:4096", b.Health.BaseURL())
	assert.Equal(t, "/global/health", b.Health.URLPath())
	assert.Equal(t, 100*time.Millisecond, b.Health.Every())
	assert.Equal(t, 3*time.Second, b.Health.PerRequest())
	assert.Equal(t, 30*time.Second, b.Health.GiveUpAfter())
	assert.Equal(t, SandboxIOPath, b.SandboxIO.BinaryPath())
	assert.Equal(t, []string{"/usr/local/bin/oac-sandbox-io", "--bootstrap-file", "/home/runtime/sandbox-io-bootstrap.json"}, SandboxIOArgv(SandboxIOPath))
}

func TestSandboxIOEncodesCanonically(t *testing.T) {
	out, err := validDoc().SandboxIO.Bootstrap.Encode()
	require.NoError(t, err)
	assert.Equal(t, `{"version":1,"link_url":"wss://link.example.com/api/v1/sandbox-link","credential":"`+secret+`",`+
		`"resource":{"tenant_id":"`+tenant+`","environment_id":"`+env+`","kind":"allocation","id":"`+alloc+`","generation":1}}`, string(out))
	back, err := DecodeSandboxIO(out)
	require.NoError(t, err)
	assert.Equal(t, validDoc().SandboxIO.Bootstrap, back)
}

func TestDaemonEnvironAddsCredentialsAndDefaults(t *testing.T) {
	env := validDoc().DaemonEnviron()
	assert.Contains(t, env, "OAC_SERVER_USERNAME=runtime")
	assert.Contains(t, env, "OAC_SERVER_PASSWORD="+secretPwd)
	assert.Contains(t, env, "HOME=/home/runtime")
	assert.Contains(t, env, "PATH="+defaultPATH)
	assert.Contains(t, env, "XDG_STATE_HOME=/home/runtime/.state")
}

func TestCredentialDigestIsSHA256OfTheTrimmedValue(t *testing.T) {
	// echo -n abc | sha256sum
	assert.Equal(t, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", CredentialDigest(" abc\n"))
}

// TestEveryValidationRule is the one table covering every rule: each row
// breaks exactly one rule of a valid bootstrap.
func TestEveryValidationRule(t *testing.T) {
	rows := []struct {
		name string
		mut  func(b *Bootstrap)
		want error
	}{
		{"version", func(b *Bootstrap) { b.Version = 2 }, ErrVersion},
		{"hostname", func(b *Bootstrap) { b.Hostname = "Bad_Host" }, ErrHostname},
		{"stop grace", func(b *Bootstrap) { b.StopGrace = dur(61 * time.Second) }, ErrStopGrace},
		{"negative stop grace", func(b *Bootstrap) { b.StopGrace = dur(-time.Second) }, ErrStopGrace},
		{"identity not a uuid", func(b *Bootstrap) { b.Sandbox.TenantID = "SECRET-not-a-uuid" }, ErrIdentity},
		{"hosted without sandbox_io", func(b *Bootstrap) { b.SandboxIO = nil }, ErrNoLink},
		{"sandbox_io without identity", func(b *Bootstrap) { b.Sandbox = nil }, ErrNoIdentity},
		{"sandbox_io path", func(b *Bootstrap) { b.SandboxIO.Path = "bin/SECRET" }, ErrSandboxIOPath},
		{"sandbox_io neither source", func(b *Bootstrap) { b.SandboxIO.Bootstrap = nil }, ErrSandboxIOSource},
		{"sandbox_io both sources", func(b *Bootstrap) { b.SandboxIO.Provided = true }, ErrSandboxIOSource},
		{"sandbox_io version", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Version = 2 }, ErrSandboxIOVersion},
		{"no link", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "" }, ErrNoLink},
		{"link ws public", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "ws://link.example.com/SECRET" }, ErrPublicURLUnreachable},
		{"link wss loopback", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://127.0.0.1:8443/SECRET" }, ErrPublicURLUnreachable},
		{"link wss localhost", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://localhost/SECRET" }, ErrPublicURLUnreachable},
		{"link wss ipv6 loopback", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://[::1]/SECRET" }, ErrPublicURLUnreachable},
		{"link wss mapped loopback", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://[::ffff:127.0.0.1]/SECRET" }, ErrPublicURLUnreachable},
		{"link wss unspecified", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://0.0.0.0/SECRET" }, ErrPublicURLUnreachable},
		{"link ws loopback hosted", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "ws://127.0.0.1:8080/SECRET" }, ErrPublicURLUnreachable},
		{"link ws public dev", func(b *Bootstrap) {
			b.Sandbox.AllowLoopbackLink = true
			b.SandboxIO.Bootstrap.LinkURL = "ws://link.example.com/SECRET"
		}, ErrLinkURLScheme},
		{"link scheme https", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "https://link.example.com/SECRET" }, ErrLinkURLScheme},
		{"link scheme uppercase", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "WSS://link.example.com/SECRET" }, ErrLinkURLScheme},
		{"link user info", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://SECRET:pw@link.example.com/" }, ErrLinkURLUserInfo},
		{"link query", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/?token=SECRET" }, ErrLinkURLQuery},
		{"link empty query", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/SECRET?" }, ErrLinkURLQuery},
		{"link fragment", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/#SECRET" }, ErrLinkURLFragment},
		{"link whitespace", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/SECRET path" }, ErrLinkURLWhitespace},
		{"link trailing newline", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/SECRET\n" }, ErrLinkURLWhitespace},
		{"link no host", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss:///SECRET" }, ErrLinkURL},
		{"link numeric host", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://127.1/SECRET" }, ErrLinkURL},
		{"link bad port", func(b *Bootstrap) { b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com:70000/SECRET" }, ErrLinkURL},
		{"link too long", func(b *Bootstrap) {
			b.SandboxIO.Bootstrap.LinkURL = "wss://link.example.com/SECRET" + strings.Repeat("a", MaxLinkURL)
		}, ErrLinkURL},
		{"credential empty", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Credential = "" }, ErrCredentialLength},
		{"credential too long", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Credential = "SECRET" + strings.Repeat("x", MaxCredential) }, ErrCredentialLength},
		{"credential space", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Credential = "SECRET value" }, ErrCredentialChars},
		{"credential NUL", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Credential = "SECRET\x00" }, ErrCredentialChars},
		{"credential unicode space", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Credential = "SECRET\u00a0x" }, ErrCredentialChars},
		{"tenant uppercase", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.TenantID = strings.ToUpper(tenant) }, ErrTenantID},
		{"tenant zero", func(b *Bootstrap) {
			b.SandboxIO.Bootstrap.Resource.TenantID = "00000000-0000-0000-0000-000000000000"
		}, ErrTenantID},
		{"environment braces", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.EnvironmentID = "{" + env + "}" }, ErrEnvironmentID},
		{"allocation no dashes", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.ID = strings.ReplaceAll(alloc, "-", "") }, ErrAllocationID},
		{"kind enrollment", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.Kind = "enrollment" }, ErrResourceKind},
		{"generation zero", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.Generation = 0 }, ErrGeneration},
		{"another tenant", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.TenantID = other }, ErrWrongTenant},
		{"another environment", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.EnvironmentID = other }, ErrWrongEnvironment},
		{"another allocation", func(b *Bootstrap) { b.SandboxIO.Bootstrap.Resource.ID = other }, ErrWrongAllocation},
		{"argv relative", func(b *Bootstrap) { b.Daemon.Argv[0] = "SECRET/server" }, ErrArgv},
		{"argv empty", func(b *Bootstrap) { b.Daemon.Argv = nil }, ErrArgv},
		{"argv NUL", func(b *Bootstrap) { b.Daemon.Argv[1] = "SECRET\x00" }, ErrArgv},
		{"env no equals", func(b *Bootstrap) { b.Daemon.Env = []string{"SECRET"} }, ErrEnv},
		{"env twice", func(b *Bootstrap) { b.Daemon.Env = []string{"A=SECRET", "A=2"} }, ErrEnv},
		{"args size", func(b *Bootstrap) { b.Daemon.Argv = append(b.Daemon.Argv, strings.Repeat("SECRET", MaxArgBytes/6+1)) }, ErrArgsSize},
		{"dir relative", func(b *Bootstrap) { b.Daemon.Dir = "SECRET" }, ErrDir},
		{"credentials without daemon", func(b *Bootstrap) { b.Daemon, b.Health = nil, nil }, ErrCredentialsNeedDaemon},
		{"username", func(b *Bootstrap) { b.Credentials.Username = "SECRET:user" }, ErrUsername},
		{"password short", func(b *Bootstrap) { b.Credentials.Password = "SECRET" }, ErrPassword},
		{"password space", func(b *Bootstrap) { b.Credentials.Password = "SECRET password with spaces" }, ErrPassword},
		{"credential env invalid", func(b *Bootstrap) { b.Credentials.UsernameEnv = "1SECRET" }, ErrCredentialEnv},
		{"credential env same", func(b *Bootstrap) { b.Credentials.PasswordEnv = b.Credentials.UsernameEnv }, ErrCredentialEnv},
		{"credential env in daemon env", func(b *Bootstrap) { b.Daemon.Env = []string{"OAC_SERVER_PASSWORD=SECRET"} }, ErrCredentialEnv},
		{"health without credentials", func(b *Bootstrap) { b.Credentials = nil }, ErrHealthNeedsCredentials},
		{"health port", func(b *Bootstrap) { b.Health.Port = 70000 }, ErrHealthPort},
		{"health port zero", func(b *Bootstrap) { b.Health.Port = 0 }, ErrHealthPort},
		{"health path relative", func(b *Bootstrap) { b.Health.Path = "SECRET" }, ErrHealthPath},
		{"health path fragment", func(b *Bootstrap) { b.Health.Path = "/health#SECRET" }, ErrHealthPath},
		{"health path authority", func(b *Bootstrap) { b.Health.Path = "//SECRET/health" }, ErrHealthPath},
		{"health interval", func(b *Bootstrap) { b.Health.Interval = dur(0) }, ErrHealthInterval},
		{"health timeout", func(b *Bootstrap) { b.Health.Timeout = dur(61 * time.Second) }, ErrHealthTimeout},
		{"health deadline", func(b *Bootstrap) { b.Health.Deadline = dur(11 * time.Minute) }, ErrHealthDeadline},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			b := validDoc()
			r.mut(b)
			err := b.Validate()
			require.ErrorIs(t, err, r.want)
			assert.NotContains(t, err.Error(), "SECRET", "messages never echo submitted values")
			// Sentinels are distinct: the error matches no other rule.
			for _, other := range allSentinels {
				if other != r.want && !errors.Is(r.want, other) {
					assert.NotErrorIs(t, err, other)
				}
			}
		})
	}
}

var allSentinels = []error{
	ErrVersion, ErrHostname, ErrArgv, ErrEnv, ErrArgsSize, ErrDir, ErrStopGrace, ErrDecode, ErrTooLarge,
	ErrDuplicateKey, ErrUnknownKey, ErrNoIdentity, ErrIdentity, ErrSandboxIOPath, ErrSandboxIOSource,
	ErrCredentialsNeedDaemon, ErrUsername, ErrPassword, ErrPasswordMissing, ErrCredentialEnv,
	ErrHealthNeedsCredentials, ErrHealthPort, ErrHealthPath, ErrHealthInterval, ErrHealthTimeout, ErrHealthDeadline,
	ErrSandboxIOTooLarge, ErrSandboxIOSyntax, ErrSandboxIOTrailing, ErrSandboxIODuplicateKey, ErrSandboxIOKeyCase,
	ErrSandboxIOUnknownKey, ErrSandboxIOMissingKey, ErrSandboxIOType, ErrSandboxIOVersion,
	ErrNoLink, ErrPublicURLUnreachable, ErrLinkURL, ErrLinkURLScheme, ErrLinkURLUserInfo, ErrLinkURLQuery,
	ErrLinkURLFragment, ErrLinkURLWhitespace, ErrCredentialLength, ErrCredentialChars, ErrTenantID,
	ErrEnvironmentID, ErrAllocationID, ErrResourceKind, ErrGeneration, ErrWrongTenant, ErrWrongEnvironment, ErrWrongAllocation,
}

// The relaxation is the operator's: a bootstrap document that names it is
// refused as an unknown key, wherever it puts it.
func TestAllowLoopbackLinkIsNotPartOfTheBootstrapSchema(t *testing.T) {
	b := validDoc()
	doc, err := json.Marshal(b)
	require.NoError(t, err)
	assert.NotContains(t, string(doc), "allow_loopback_link", "never encoded, even when set")
	for _, in := range []string{
		strings.Replace(string(doc), `"tenant_id":`, `"allow_loopback_link":true,"tenant_id":`, 1),
		strings.Replace(string(doc), `"tenant_id":`, `"allow_loopback_link":false,"tenant_id":`, 1),
		strings.Replace(string(doc), `"version":1,`, `"version":1,"allow_loopback_link":true,`, 1),
	} {
		_, err := Decode(strings.NewReader(in))
		assert.ErrorIs(t, err, ErrUnknownKey, in)
	}
}

func TestLoopbackLinkAllowedOnlyWhenTheIdentitySaysSo(t *testing.T) {
	for _, u := range []string{"ws://127.0.0.1:8080/link", "wss://localhost/link", "ws://[::1]:1/x", "ws://relay.localhost/x"} {
		b := validDoc()
		b.Sandbox.AllowLoopbackLink = true
		b.SandboxIO.Bootstrap.LinkURL = u
		assert.NoError(t, b.Validate(), u)
	}
	b := validDoc()
	b.Sandbox.AllowLoopbackLink = true
	assert.NoError(t, b.Validate(), "wss to a public host stays fine")
}

func TestProvidedFileNeedsNoContentFromTheHost(t *testing.T) {
	b := validDoc()
	b.SandboxIO = &SandboxIOSpec{Provided: true, Path: "/opt/io/oac-sandbox-io"}
	require.NoError(t, b.Validate())
	assert.Equal(t, "/opt/io/oac-sandbox-io", b.SandboxIO.BinaryPath())
}

func TestPasswordMayBeEmptyOnTheHostButNotInTheGuest(t *testing.T) {
	b := validDoc()
	b.Credentials.Password = ""
	require.NoError(t, b.Validate())
	require.ErrorIs(t, b.ValidateInGuest(), ErrPasswordMissing)
}

// sandboxIOJSON is a valid private file with %s-free placeholders a row
// can rewrite.
const sandboxIOJSON = `{"version": 1, "link_url": "wss://link.example.com/api/v1/sandbox-link", "credential": "` + secret + `",
 "resource": {"tenant_id": "` + tenant + `", "environment_id": "` + env + `", "kind": "allocation", "id": "` + alloc + `", "generation": 1}}`

func TestStrictSandboxIODecoding(t *testing.T) {
	_, err := DecodeSandboxIO([]byte(sandboxIOJSON))
	require.NoError(t, err)
	rows := []struct {
		name string
		doc  string
		want error
	}{
		{"duplicate top key", strings.Replace(sandboxIOJSON, `"version": 1,`, `"version": 1, "version": 1,`, 1), ErrSandboxIODuplicateKey},
		{"duplicate via escape", strings.Replace(sandboxIOJSON, `"version": 1,`, `"version": 1, "\u0076ersion": 1,`, 1), ErrSandboxIODuplicateKey},
		{"duplicate credential", strings.Replace(sandboxIOJSON, `"version": 1,`, `"credential": "SECRET-other", "version": 1,`, 1), ErrSandboxIODuplicateKey},
		{"duplicate nested key", strings.Replace(sandboxIOJSON, `"kind": "allocation",`, `"kind": "allocation", "kind": "allocation",`, 1), ErrSandboxIODuplicateKey},
		{"case variant key", strings.Replace(sandboxIOJSON, `"link_url"`, `"Link_URL"`, 1), ErrSandboxIOKeyCase},
		{"case variant nested", strings.Replace(sandboxIOJSON, `"tenant_id"`, `"TENANT_ID"`, 1), ErrSandboxIOKeyCase},
		{"unknown key", strings.Replace(sandboxIOJSON, `"version": 1,`, `"version": 1, "SECRET": 1,`, 1), ErrSandboxIOUnknownKey},
		{"unknown nested key", strings.Replace(sandboxIOJSON, `"generation": 1`, `"generation": 1, "extra": "SECRET"`, 1), ErrSandboxIOUnknownKey},
		{"missing key", strings.Replace(sandboxIOJSON, `"version": 1,`, ``, 1), ErrSandboxIOMissingKey},
		{"missing nested key", strings.Replace(sandboxIOJSON, `, "generation": 1`, ``, 1), ErrSandboxIOMissingKey},
		{"missing link", strings.Replace(sandboxIOJSON, `"link_url": "wss://link.example.com/api/v1/sandbox-link",`, ``, 1), ErrNoLink},
		{"trailing object", sandboxIOJSON + ` {}`, ErrSandboxIOTrailing},
		{"trailing garbage", sandboxIOJSON + `SECRET`, ErrSandboxIOTrailing},
		{"version string", strings.Replace(sandboxIOJSON, `"version": 1`, `"version": "1"`, 1), ErrSandboxIOType},
		{"version float", strings.Replace(sandboxIOJSON, `"version": 1`, `"version": 1.0`, 1), ErrSandboxIOType},
		{"generation exponent", strings.Replace(sandboxIOJSON, `"generation": 1`, `"generation": 1e0`, 1), ErrSandboxIOType},
		{"resource array", `{"version":1,"link_url":"wss://a.example","credential":"x","resource":[]}`, ErrSandboxIOType},
		{"credential null", strings.Replace(sandboxIOJSON, `"`+secret+`"`, `null`, 1), ErrSandboxIOType},
		{"top-level array", `[1]`, ErrSandboxIOType},
		{"truncated", sandboxIOJSON[:len(sandboxIOJSON)-5], ErrSandboxIOSyntax},
		{"empty", ``, ErrSandboxIOSyntax},
		{"invalid utf-8", strings.Replace(sandboxIOJSON, secret, "SECRET\xff", 1), ErrSandboxIOSyntax},
		{"too large", sandboxIOJSON + strings.Repeat(" ", MaxSandboxIOSize), ErrSandboxIOTooLarge},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			_, err := DecodeSandboxIO([]byte(r.doc))
			require.ErrorIs(t, err, r.want)
			assert.NotContains(t, err.Error(), "SECRET")
		})
	}
}

func TestBootstrapDecodingIsStrictAtEveryLevel(t *testing.T) {
	valid, err := json.Marshal(validDoc())
	require.NoError(t, err)
	doc := string(valid)
	_, err = Decode(strings.NewReader(doc))
	require.NoError(t, err)
	rows := []struct {
		name string
		doc  string
		want error
	}{
		{"case variant top key", strings.Replace(doc, `"version":1,"hostname"`, `"Version":1,"hostname"`, 1), ErrUnknownKey},
		{"case variant nested key", strings.Replace(doc, `"argv"`, `"ARGV"`, 1), ErrUnknownKey},
		{"unknown key", strings.Replace(doc, `"hostname"`, `"SECRET":1,"hostname"`, 1), ErrUnknownKey},
		{"duplicate key", strings.Replace(doc, `"hostname":"demo"`, `"hostname":"demo","hostname":"other"`, 1), ErrDuplicateKey},
		{"duplicate nested key", strings.Replace(doc, `"port":4096`, `"port":4096,"port":1`, 1), ErrDuplicateKey},
		{"duplicate sandbox_io key", strings.Replace(doc, `"credential":"`, `"credential":"SECRET","credential":"`, 1), ErrSandboxIODuplicateKey},
		{"case variant sandbox_io key", strings.Replace(doc, `"link_url"`, `"LINK_URL"`, 1), ErrSandboxIOKeyCase},
		{"unknown sandbox_io key", strings.Replace(doc, `"link_url"`, `"SECRET":"x","link_url"`, 1), ErrSandboxIOUnknownKey},
		{"sandbox_io too large", strings.Replace(doc, `"link_url"`, strings.Repeat(" ", MaxSandboxIOSize)+`"link_url"`, 1), ErrSandboxIOTooLarge},
		{"trailing data", doc + `{}`, ErrDecode},
		{"wrong type", strings.Replace(doc, `"port":4096`, `"port":"SECRET"`, 1), ErrDecode},
		{"syntax", doc[:len(doc)-1], ErrDecode},
		{"too large", doc + strings.Repeat(" ", MaxSize), ErrTooLarge},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(r.doc))
			require.ErrorIs(t, err, r.want)
			assert.NotContains(t, err.Error(), "SECRET")
		})
	}
}
