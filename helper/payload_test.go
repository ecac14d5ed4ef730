package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Identities and secrets of the payloads below. The secrets are
// recognizable so a test can tell they never reach an error message.
const (
	tenantID      = "11111111-1111-4111-8111-111111111111"
	environmentID = "22222222-2222-4222-8222-222222222222"
	allocationID  = "33333333-3333-4333-8333-333333333333"
	linkURL       = "wss://link.example.com/api/v1/sandbox-link"
	credential    = "SECRET-credential-4f1c9a7e"
	password      = "SECRET-password-0123456789"
)

// sandboxIOJSON is a valid sandbox_io, oac-sandbox-io's input.
const sandboxIOJSON = `{"version": 1, "link_url": "` + linkURL + `", "credential": "` + credential + `",
  "resource": {"tenant_id": "` + tenantID + `", "environment_id": "` + environmentID + `",
               "kind": "allocation", "id": "` + allocationID + `", "generation": 3}}`

// payload is a valid helper payload with every field Core's shape has.
const payload = `{
  "runtime": {
    "command": ["/usr/bin/server", "serve", "--hostname", "0.0.0.0", "--port", "4096"],
    "env": {"XDG_STATE_HOME": "/home/runtime/.state", "LANG": "C.UTF-8", "OPTS": "a=b c"},
    "workdir": "/environment/workspace",
    "hostname": "demo",
    "port": 4096,
    "health_path": "/global/health",
    "username": "runtime",
    "password": "` + password + `",
    "username_env": "PRODUCT_SERVER_USERNAME",
    "password_env": "PRODUCT_SERVER_PASSWORD",
    "stop_grace_ms": 2500
  },
  "sandbox_io": ` + sandboxIOJSON + `
}`

// waitFor is f's result, or a failure when f takes longer than 5 s (a
// read that waits for stdin to end would never return).
func waitFor[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return", what)
		panic("unreachable")
	}
}

// returnsSoon reports whether done yields within 100 ms.
func returnsSoon[T any](done <-chan T) bool {
	select {
	case <-done:
		return true
	case <-time.After(100 * time.Millisecond):
		return false
	}
}

// write writes s to w in the background; the channel gets its result.
func write(w io.Writer, s string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(w, s)
		done <- err
	}()
	return done
}

// watch runs WatchRest(rest) in the background.
func watch(rest io.Reader) <-chan error {
	done := make(chan error, 1)
	go func() { done <- WatchRest(rest) }()
	return done
}

type readResult struct {
	boot *bootstrap.Bootstrap
	rest io.Reader
	err  error
}

func (r readResult) unpack() (*bootstrap.Bootstrap, io.Reader, error) { return r.boot, r.rest, r.err }

// readOpenPipe writes payload to an open pipe and returns what ReadPayload
// returns, with stdin (the pipe's writer) still open. The pipe is closed
// when the test ends.
func readOpenPipe(t *testing.T, payload string) (*bootstrap.Bootstrap, io.Reader, *io.PipeWriter) {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close(); pw.Close() })
	written := write(pw, payload)
	res := waitFor(t, "ReadPayload with stdin open", func() readResult {
		b, rest, err := ReadPayload(pr)
		return readResult{b, rest, err}
	})
	require.NoError(t, res.err)
	require.NotNil(t, res.boot)
	require.NotNil(t, res.rest)
	require.NoError(t, waitFor(t, "the payload's write", func() error { return <-written }),
		"the whole payload was read")
	return res.boot, res.rest, pw
}

func TestReadPayloadReturnsOnceTheObjectIsCompleteWhileStdinStaysOpen(t *testing.T) {
	boot, rest, pw := readOpenPipe(t, payload)
	assert.Equal(t, []string{"/usr/bin/server", "serve", "--hostname", "0.0.0.0", "--port", "4096"}, boot.Daemon.Argv)

	// Then stdin carries whitespace, and WatchRest keeps watching until
	// it closes.
	watching := watch(rest)
	require.NoError(t, waitFor(t, "the whitespace's write", func() error { return <-write(pw, "\n \t") }))
	assert.False(t, returnsSoon(watching), "WatchRest returned while stdin is open")
	require.NoError(t, pw.Close())
	assert.NoError(t, waitFor(t, "WatchRest after stdin closed", func() error { return <-watching }))
}

func TestAByteOtherThanWhitespaceAfterThePayloadIsTrailingInput(t *testing.T) {
	_, rest, pw := readOpenPipe(t, payload)
	watching := watch(rest)
	write(pw, "\n \tx") // the write ends with the pipe, when the test does
	err := waitFor(t, "WatchRest with stdin open", func() error { return <-watching })
	assert.ErrorIs(t, err, ErrTrailingInput, "without waiting for stdin to close")
}

func TestBytesInTheSameWriteAfterThePayloadAreKeptInTheRest(t *testing.T) {
	t.Run("a pipe", func(t *testing.T) {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pr.Close() })
		go func() {
			_, err := io.WriteString(pw, payload+"\n  ")
			pw.CloseWithError(err)
		}()
		_, rest, err := waitFor(t, "ReadPayload", func() readResult {
			b, rest, err := ReadPayload(pr)
			return readResult{b, rest, err}
		}).unpack()
		require.NoError(t, err)
		got, err := io.ReadAll(rest)
		require.NoError(t, err)
		assert.Equal(t, "\n  ", string(got))
	})
	t.Run("one buffer", func(t *testing.T) {
		_, rest, err := ReadPayload(strings.NewReader(payload + "\n  tail"))
		require.NoError(t, err)
		got, err := io.ReadAll(rest)
		require.NoError(t, err)
		assert.Equal(t, "\n  tail", string(got))
	})
	t.Run("trailing bytes the decoder buffered are still watched", func(t *testing.T) {
		_, rest, err := ReadPayload(strings.NewReader(payload + " x"))
		require.NoError(t, err)
		assert.ErrorIs(t, WatchRest(rest), ErrTrailingInput)

		_, rest, err = ReadPayload(strings.NewReader(payload + " \r\n\t"))
		require.NoError(t, err)
		assert.NoError(t, WatchRest(rest))
	})
}

func TestAReadErrorAfterThePayloadIsWatchRestsError(t *testing.T) {
	broken := errors.New("stdin broke")
	err := WatchRest(io.MultiReader(strings.NewReader("\n"), iotest.ErrReader(broken)))
	assert.ErrorIs(t, err, broken)
	assert.NotErrorIs(t, err, ErrTrailingInput)
}

// oversized is a well-formed payload larger than bootstrap.MaxSize.
func oversized() string {
	return `{"runtime":{"command":["/bin/true","` + strings.Repeat("a", bootstrap.MaxSize) +
		`"],"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `}`
}

// malformed are payloads ReadPayload refuses, each with the named error,
// and each carrying the credential and, where it can, the password.
var malformed = []struct {
	name string
	in   string
	want error
}{
	{"empty stdin", "", bootstrap.ErrDecode},
	{"only whitespace", " \n\t", bootstrap.ErrDecode},
	{"a JSON array", `[{"sandbox_io":` + sandboxIOJSON + `}]`, bootstrap.ErrDecode},
	{"a JSON string", `"` + credential + `"`, bootstrap.ErrDecode},
	{"a JSON number", `4096 `, bootstrap.ErrDecode},
	{"null", `null`, bootstrap.ErrDecode},
	{"an unterminated object", `{"runtime":{"password":"` + password + `"},"sandbox_io":{"credential":"` + credential, bootstrap.ErrDecode},
	{"a syntax error after the secrets", `{"runtime":{"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + ` "x"}`, bootstrap.ErrDecode},
	{"a value of the wrong type", `{"runtime":{"command":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `}`, bootstrap.ErrDecode},
	{"a secret where a number goes", `{"runtime":{"port":"` + password + `","password":"` + password + `"}}`, bootstrap.ErrDecode},
	{"over MaxSize", oversized(), bootstrap.ErrTooLarge},
	{"a Go field name", `{"Runtime":{"command":["/bin/true"],"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `}`, bootstrap.ErrUnknownKey},
	{"a Go field name inside runtime", `{"runtime":{"Command":["/bin/true"],"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `}`, bootstrap.ErrUnknownKey},
	{"an unknown key", `{"runtime":{"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `,"version":1}`, bootstrap.ErrUnknownKey},
	{"a key twice", `{"runtime":{"password":"` + password + `"},"sandbox_io":` + sandboxIOJSON + `,"runtime":{"command":["/bin/false"]}}`, bootstrap.ErrDuplicateKey},
	{"an env name twice", `{"runtime":{"command":["/bin/true"],"env":{"A":"` + password + `","A":"2"},"password":"` + password + `"}}`, bootstrap.ErrDuplicateKey},
	{"a port without credentials", `{"runtime":{"command":["/bin/true"],"port":4096},"sandbox_io":` + sandboxIOJSON + `}`, bootstrap.ErrHealthNeedsCredentials},
	{"a health path without credentials", `{"runtime":{"command":["/bin/true"],"health_path":"/h"},"sandbox_io":` + sandboxIOJSON + `}`, bootstrap.ErrHealthNeedsCredentials},
	{"a Go field name inside sandbox_io", `{"runtime":{"password":"` + password + `"},"sandbox_io":{"version":1,"link_url":"` + linkURL + `","Credential":"` + credential + `","resource":{}}}`, bootstrap.ErrSandboxIOKeyCase},
	{"a sandbox_io missing its resource", `{"runtime":{"password":"` + password + `"},"sandbox_io":{"version":1,"link_url":"` + linkURL + `","credential":"` + credential + `"}}`, bootstrap.ErrSandboxIOMissingKey},
	{"a sandbox_io without link_url", `{"sandbox_io":{"version":1,"credential":"` + credential + `","resource":{"tenant_id":"` + tenantID +
		`","environment_id":"` + environmentID + `","kind":"allocation","id":"` + allocationID + `","generation":1}}}`, bootstrap.ErrNoLink},
	{"a credential that is not a string", `{"runtime":{"password":"` + password + `"},"sandbox_io":{"version":1,"link_url":"` + linkURL + `","credential":["` + credential + `"],"resource":{}}}`, bootstrap.ErrSandboxIOType},
}

func TestReadPayloadErrorsAreTheNamedOnes(t *testing.T) {
	for _, tc := range malformed {
		t.Run(tc.name, func(t *testing.T) {
			b, rest, err := ReadPayload(strings.NewReader(tc.in))
			require.ErrorIs(t, err, tc.want)
			assert.ErrorIs(t, err, bootstrap.ErrInvalid, "every refusal is a rule of package bootstrap")
			assert.Nil(t, b)
			assert.Nil(t, rest)
		})
	}
}

func TestAnErrorMessageNeverContainsACredentialOrPassword(t *testing.T) {
	for _, tc := range malformed {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadPayload(strings.NewReader(tc.in))
			require.Error(t, err)
			assert.NotContains(t, err.Error(), credential)
			assert.NotContains(t, err.Error(), password)
			assert.NotContains(t, err.Error(), "SECRET")
		})
	}
}

func TestAnOversizedPayloadIsRefusedWithoutWaitingForStdinToEnd(t *testing.T) {
	pr, pw := io.Pipe()
	// ReadPayload stops reading after MaxSize+1 bytes: closing the reader
	// ends the write, which would otherwise wait for the rest to be read.
	t.Cleanup(func() { pr.Close() })
	write(pw, oversized()+strings.Repeat(" ", 1<<20))
	err := waitFor(t, "ReadPayload of an oversized payload", func() error {
		_, _, err := ReadPayload(pr)
		return err
	})
	assert.ErrorIs(t, err, bootstrap.ErrTooLarge)
}

func TestAPayloadOfExactlyMaxSizeIsRead(t *testing.T) {
	head := `{"runtime":{"command":["/bin/true","`
	tail := `"]}}`
	in := head + strings.Repeat("a", bootstrap.MaxSize-len(head)-len(tail)) + tail
	require.Len(t, in, bootstrap.MaxSize)
	b, rest, err := ReadPayload(strings.NewReader(in + "\n"))
	require.NoError(t, err)
	assert.Len(t, b.Daemon.Argv[1], bootstrap.MaxSize-len(head)-len(tail))
	assert.NoError(t, WatchRest(rest))

	_, _, err = ReadPayload(strings.NewReader(head + "a" + in[len(head):]))
	assert.ErrorIs(t, err, bootstrap.ErrTooLarge, "one byte more")
}

// A valid payload maps as bootstrap.FromCore documents: runtime.command to
// daemon.argv, runtime.env to daemon.env (NAME=VALUE sorted by NAME),
// port and health_path to health, the credentials, stop_grace_ms to
// stop_grace, and sandbox_io to sandbox_io.bootstrap. The identity is not
// the payload's: Run adds it.
func TestAPayloadMapsFieldByFieldAsFromCoreDocuments(t *testing.T) {
	b, _, err := ReadPayload(strings.NewReader(payload))
	require.NoError(t, err)
	grace := bootstrap.Duration(2500 * time.Millisecond)
	want := &bootstrap.Bootstrap{
		Version:  bootstrap.Version,
		Hostname: "demo",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: linkURL, Credential: credential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 3},
		}},
		Daemon: &bootstrap.Process{
			Argv: []string{"/usr/bin/server", "serve", "--hostname", "0.0.0.0", "--port", "4096"},
			Env:  []string{"LANG=C.UTF-8", "OPTS=a=b c", "XDG_STATE_HOME=/home/runtime/.state"},
			Dir:  "/environment/workspace",
		},
		Credentials: &bootstrap.Credentials{
			Username: "runtime", Password: password,
			UsernameEnv: "PRODUCT_SERVER_USERNAME", PasswordEnv: "PRODUCT_SERVER_PASSWORD",
		},
		Health:    &bootstrap.Health{Port: 4096, Path: "/global/health"},
		StopGrace: &grace,
	}
	assert.Equal(t, want, b)

	b.Sandbox = &bootstrap.Identity{TenantID: tenantID, EnvironmentID: environmentID, AllocationID: allocationID}
	assert.NoError(t, b.ValidateInGuest(), "with the identity Run adds, the payload is valid in the guest")
}

func TestAPayloadRoundTripsThroughToCore(t *testing.T) {
	for name, in := range map[string]string{
		"every field":     payload,
		"runtime only":    `{"runtime":{"command":["/bin/sleep","1000"],"env":{"B":"2","A":"1"}}}`,
		"sandbox_io only": `{"sandbox_io":` + sandboxIOJSON + `}`,
		"env only":        `{"runtime":{"env":{"A":""}}}`,
		"hostname only":   `{"runtime":{"hostname":"demo"}}`,
		"empty":           `{}`,
		"null sections":   `{"runtime":null,"sandbox_io":null}`,
	} {
		t.Run(name, func(t *testing.T) {
			// Core -> Bootstrap -> Core.
			var c bootstrap.Core
			require.NoError(t, json.Unmarshal([]byte(in), &c))
			b, _, err := ReadPayload(strings.NewReader(in))
			require.NoError(t, err)
			back, err := bootstrap.ToCore(b)
			require.NoError(t, err)
			assert.Equal(t, &c, back)

			// Bootstrap -> Core -> Bootstrap.
			data, err := json.Marshal(back)
			require.NoError(t, err)
			again, rest, err := ReadPayload(bytes.NewReader(data))
			require.NoError(t, err)
			assert.Equal(t, b, again)
			assert.NoError(t, WatchRest(rest))
		})
	}
}
