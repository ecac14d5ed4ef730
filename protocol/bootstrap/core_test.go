package bootstrap

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// coreDoc is Core's shape with every field the mapping knows.
const coreDoc = `{
  "runtime": {
    "command": ["/usr/bin/server", "serve", "--hostname", "0.0.0.0", "--port", "4096"],
    "env": {"XDG_STATE_HOME": "/home/runtime/.state", "LANG": "C.UTF-8"},
    "workdir": "/environment/workspace",
    "hostname": "demo",
    "port": 4096,
    "health_path": "/global/health",
    "username": "runtime",
    "username_env": "PRODUCT_SERVER_USERNAME",
    "password_env": "PRODUCT_SERVER_PASSWORD",
    "stop_grace_ms": 6000
  },
  "sandbox_io": {"version": 1, "link_url": "wss://link.example.com/api/v1/sandbox-link", "credential": "SECRET-credential-value",
                 "resource": {"tenant_id": "0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21", "environment_id": "1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32",
                              "kind": "allocation", "id": "2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43", "generation": 1}}
}`

// The mapping, field by field, as docs/schema.md gives it.
func TestCoreMapsFieldByFieldToTheBootstrap(t *testing.T) {
	b, err := DecodeCore(strings.NewReader(coreDoc))
	require.NoError(t, err)
	grace := Duration(6 * time.Second)
	want := &Bootstrap{
		Version:  1,
		Hostname: "demo",
		SandboxIO: &SandboxIOSpec{Bootstrap: &SandboxIO{
			Version: 1, LinkURL: "wss://link.example.com/api/v1/sandbox-link", Credential: secret,
			Resource: Resource{TenantID: tenant, EnvironmentID: env, Kind: "allocation", ID: alloc, Generation: 1},
		}},
		Daemon: &Process{
			Argv: []string{"/usr/bin/server", "serve", "--hostname", "0.0.0.0", "--port", "4096"},
			Env:  []string{"LANG=C.UTF-8", "XDG_STATE_HOME=/home/runtime/.state"},
			Dir:  "/environment/workspace",
		},
		Credentials: &Credentials{Username: "runtime", UsernameEnv: "PRODUCT_SERVER_USERNAME", PasswordEnv: "PRODUCT_SERVER_PASSWORD"},
		Health:      &Health{Port: 4096, Path: "/global/health"},
		StopGrace:   &grace,
	}
	assert.Equal(t, want, b)
	b.Sandbox = &Identity{TenantID: tenant, EnvironmentID: env, AllocationID: alloc}
	assert.NoError(t, b.Validate(), "the host adds the identity from its flags; then it is valid")
}

func TestCoreRoundTripsBothWays(t *testing.T) {
	// Core -> Bootstrap -> Core.
	var c Core
	require.NoError(t, json.Unmarshal([]byte(coreDoc), &c))
	b, err := FromCore(&c)
	require.NoError(t, err)
	back, err := ToCore(b)
	require.NoError(t, err)
	assert.Equal(t, &c, back)

	// Bootstrap -> Core -> Bootstrap, for every bootstrap Core can carry.
	for name, b := range map[string]*Bootstrap{
		"full":        func() *Bootstrap { b := validDoc(); b.Sandbox = nil; return b }(),
		"daemon only": {Version: 1, Daemon: &Process{Argv: []string{"/bin/sleep", "1000"}}},
		"link only":   {Version: 1, SandboxIO: validDoc().SandboxIO},
		"empty":       {Version: 1},
	} {
		c, err := ToCore(b)
		require.NoError(t, err, name)
		data, err := json.Marshal(c)
		require.NoError(t, err, name)
		got, err := DecodeCore(strings.NewReader(string(data)))
		require.NoError(t, err, name)
		assert.Equal(t, b, got, name)
	}
}

func TestWhatCoresShapeCannotCarryIsRefused(t *testing.T) {
	for name, mod := range map[string]func(*Bootstrap){
		"identity":       func(b *Bootstrap) {},
		"provided file":  func(b *Bootstrap) { b.Sandbox = nil; b.SandboxIO = &SandboxIOSpec{Provided: true} },
		"another path":   func(b *Bootstrap) { b.Sandbox = nil; b.SandboxIO.Path = "/opt/oac-sandbox-io" },
		"health timings": func(b *Bootstrap) { b.Sandbox = nil; b.Health.Interval = dur(time.Second) },
		"a repeated env": func(b *Bootstrap) { b.Sandbox = nil; b.Daemon.Env = []string{"A=1", "A=2"} },
	} {
		b := validDoc()
		mod(b)
		_, err := ToCore(b)
		assert.ErrorIs(t, err, ErrNotCore, name)
	}
}

func TestCoreDecodingIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown key":     `{"runtime":{"command":["/bin/true"],"Command":["/x"]}}`,
		"repeated key":    `{"runtime":{"command":["/bin/true"]},"runtime":{"command":["/bin/false"]}}`,
		"repeated env":    `{"runtime":{"command":["/bin/true"],"env":{"A":"1","A":"2"}}}`,
		"trailing data":   `{"runtime":{"command":["/bin/true"]}} {}`,
		"a port, no user": `{"runtime":{"command":["/bin/true"],"port":4096}}`,
		"strict link":     `{"sandbox_io":{"version":1,"link_url":"wss://l.example.com","credential":"c","resource":{},"extra":1}}`,
	} {
		_, err := DecodeCore(strings.NewReader(doc))
		assert.ErrorIs(t, err, ErrInvalid, name)
		assert.NotContains(t, errText(err), "/bin/false", name)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestAStopGraceOutOfRangeIsRefusedNotWrappedIntoAShortOne(t *testing.T) {
	for _, ms := range []string{"18446744073710", "-1", "60001"} {
		_, err := DecodeCore(strings.NewReader(`{"runtime":{"command":["/bin/true"],"stop_grace_ms":` + ms + `}}`))
		assert.ErrorIs(t, err, ErrStopGrace, ms)
	}
	b, err := DecodeCore(strings.NewReader(`{"runtime":{"command":["/bin/true"],"stop_grace_ms":60000}}`))
	require.NoError(t, err)
	assert.Equal(t, Duration(time.Minute), *b.StopGrace)
}
