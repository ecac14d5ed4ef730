package bootstrap_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

func grace(d time.Duration) *bootstrap.Duration {
	v := bootstrap.Duration(d)
	return &v
}

func daemon(argv ...string) *bootstrap.Process { return &bootstrap.Process{Argv: argv} }

func envN(n int) []string {
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("K%d=v", i)
	}
	return env
}

func argvN(n int) []string {
	argv := make([]string, n)
	argv[0] = "/bin/true"
	for i := 1; i < n; i++ {
		argv[i] = "x"
	}
	return argv
}

// TestValidate covers every rule: each invalid case must fail with exactly
// its rule's sentinel, each boundary case must pass.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    bootstrap.Bootstrap
		err  error // nil: valid
	}{
		// Version.
		{"minimal", bootstrap.Bootstrap{Version: 1}, nil},
		{"version 0", bootstrap.Bootstrap{}, bootstrap.ErrVersion},
		{"version 2", bootstrap.Bootstrap{Version: 2}, bootstrap.ErrVersion},
		{"version -1", bootstrap.Bootstrap{Version: -1}, bootstrap.ErrVersion},

		// Hostname.
		{"hostname one char", bootstrap.Bootstrap{Version: 1, Hostname: "a"}, nil},
		{"hostname with digits and dash", bootstrap.Bootstrap{Version: 1, Hostname: "web-01"}, nil},
		{"hostname of 64 chars", bootstrap.Bootstrap{Version: 1, Hostname: strings.Repeat("a", 64)}, nil},
		{"hostname of 65 chars", bootstrap.Bootstrap{Version: 1, Hostname: strings.Repeat("a", 65)}, bootstrap.ErrHostname},
		{"hostname starting with dash", bootstrap.Bootstrap{Version: 1, Hostname: "-web"}, bootstrap.ErrHostname},
		{"hostname ending with dash", bootstrap.Bootstrap{Version: 1, Hostname: "web-"}, bootstrap.ErrHostname},
		{"hostname only a dash", bootstrap.Bootstrap{Version: 1, Hostname: "-"}, bootstrap.ErrHostname},
		{"hostname upper case", bootstrap.Bootstrap{Version: 1, Hostname: "Web"}, bootstrap.ErrHostname},
		{"hostname with dot", bootstrap.Bootstrap{Version: 1, Hostname: "web.local"}, bootstrap.ErrHostname},
		{"hostname with underscore", bootstrap.Bootstrap{Version: 1, Hostname: "web_1"}, bootstrap.ErrHostname},
		{"hostname with space", bootstrap.Bootstrap{Version: 1, Hostname: "web 1"}, bootstrap.ErrHostname},
		{"hostname with NUL", bootstrap.Bootstrap{Version: 1, Hostname: "web\x00"}, bootstrap.ErrHostname},
		{"hostname non-ASCII", bootstrap.Bootstrap{Version: 1, Hostname: "wéb"}, bootstrap.ErrHostname},

		// Stop grace.
		{"stop grace 0", bootstrap.Bootstrap{Version: 1, StopGrace: grace(0)}, nil},
		{"stop grace 60s", bootstrap.Bootstrap{Version: 1, StopGrace: grace(60 * time.Second)}, nil},
		{"stop grace 60s and 1ns", bootstrap.Bootstrap{Version: 1, StopGrace: grace(60*time.Second + 1)}, bootstrap.ErrStopGrace},
		{"stop grace negative", bootstrap.Bootstrap{Version: 1, StopGrace: grace(-time.Nanosecond)}, bootstrap.ErrStopGrace},

		// Argv.
		{"daemon absolute argv", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/usr/bin/sleep", "infinity")}, nil},
		{"daemon with 256 args", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: argvN(256)}}, nil},
		{"daemon args may be empty or relative", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/bin/sh", "", "./x", "../y")}, nil},
		{"daemon without argv", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{}}, bootstrap.ErrArgv},
		{"daemon with 257 args", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: argvN(257)}}, bootstrap.ErrArgv},
		{"daemon relative program", bootstrap.Bootstrap{Version: 1, Daemon: daemon("sleep")}, bootstrap.ErrArgv},
		{"daemon empty program", bootstrap.Bootstrap{Version: 1, Daemon: daemon("")}, bootstrap.ErrArgv},
		{"daemon program with dot-dot", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/usr/bin/../bin/sleep")}, bootstrap.ErrArgv},
		{"daemon program with double slash", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/usr//bin/sleep")}, bootstrap.ErrArgv},
		{"daemon program with trailing slash", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/usr/bin/")}, bootstrap.ErrArgv},
		{"daemon program with NUL", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/bin/sh\x00")}, bootstrap.ErrArgv},
		{"daemon argument with NUL", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/bin/sh", "-c", "a\x00b")}, bootstrap.ErrArgv},

		// Env.
		{"env entries", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A=1", "_x=", "lower_9=a=b", "EMPTY="}}}, nil},
		{"env of 256 entries", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: envN(256)}}, nil},
		{"env of 257 entries", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: envN(257)}}, bootstrap.ErrEnv},
		{"env without =", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"PATH"}}}, bootstrap.ErrEnv},
		{"env with empty key", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"=v"}}}, bootstrap.ErrEnv},
		{"env key starting with digit", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"1A=v"}}}, bootstrap.ErrEnv},
		{"env key with dash", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A-B=v"}}}, bootstrap.ErrEnv},
		{"env key with space", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A B=v"}}}, bootstrap.ErrEnv},
		{"env key non-ASCII", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"É=v"}}}, bootstrap.ErrEnv},
		{"env value with NUL", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A=v\x00"}}}, bootstrap.ErrEnv},
		{"env key twice", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A=1", "B=2", "A=3"}}}, bootstrap.ErrEnv},

		// Total argv and env size.
		{"argv and env of exactly 64 KiB", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{
			Argv: []string{"/bin/true", strings.Repeat("a", 32<<10-len("/bin/true"))},
			Env:  []string{"A=" + strings.Repeat("b", 32<<10-2)},
		}}, nil},
		{"argv alone over 64 KiB", bootstrap.Bootstrap{Version: 1, Daemon: daemon("/bin/true", strings.Repeat("a", 64<<10))}, bootstrap.ErrArgsSize},
		{"argv and env together over 64 KiB", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{
			Argv: []string{"/bin/true", strings.Repeat("a", 32<<10-len("/bin/true"))},
			Env:  []string{"A=" + strings.Repeat("b", 32<<10-1)},
		}}, bootstrap.ErrArgsSize},

		// Dir.
		{"dir absolute", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "/environment/workspace"}}, nil},
		{"dir root", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "/"}}, nil},
		{"dir relative", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "workspace"}}, bootstrap.ErrDir},
		{"dir with dot-dot", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "/a/../b"}}, bootstrap.ErrDir},
		{"dir with trailing slash", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "/a/"}}, bootstrap.ErrDir},
		{"dir with NUL", bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/bin/true"}, Dir: "/a\x00"}}, bootstrap.ErrDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Validate()
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			for _, other := range []error{
				bootstrap.ErrVersion, bootstrap.ErrHostname, bootstrap.ErrArgv, bootstrap.ErrEnv,
				bootstrap.ErrArgsSize, bootstrap.ErrDir, bootstrap.ErrStopGrace,
			} {
				if other != tc.err {
					assert.NotErrorIs(t, err, other)
				}
			}
		})
	}
}

func TestValidateNamesTheDaemonInProcessErrors(t *testing.T) {
	err := (&bootstrap.Bootstrap{Version: 1, Daemon: daemon("sleep")}).Validate()

	require.ErrorIs(t, err, bootstrap.ErrArgv)
	assert.True(t, strings.HasPrefix(err.Error(), "daemon: "), err.Error())
}

func TestValidateReportsTheFirstRuleThatFails(t *testing.T) {
	b := &bootstrap.Bootstrap{Version: 2, Hostname: "-", StopGrace: grace(-1), Daemon: daemon("x")}
	assert.ErrorIs(t, b.Validate(), bootstrap.ErrVersion)

	b.Version = 1
	assert.ErrorIs(t, b.Validate(), bootstrap.ErrHostname)

	b.Hostname = ""
	assert.ErrorIs(t, b.Validate(), bootstrap.ErrStopGrace)

	b.StopGrace = nil
	assert.ErrorIs(t, b.Validate(), bootstrap.ErrArgv)
}

func TestDecodeReadsAFullBootstrap(t *testing.T) {
	doc := `{
		"version": 1,
		"hostname": "box-1",
		"daemon": {"argv": ["/usr/bin/sleep", "infinity"], "env": ["A=1"], "dir": "/tmp"},
		"stop_grace": "2.5s"
	}`

	b, err := bootstrap.Decode(strings.NewReader(doc))

	require.NoError(t, err)
	require.NoError(t, b.Validate())
	assert.Equal(t, &bootstrap.Bootstrap{
		Version:   1,
		Hostname:  "box-1",
		Daemon:    &bootstrap.Process{Argv: []string{"/usr/bin/sleep", "infinity"}, Env: []string{"A=1"}, Dir: "/tmp"},
		StopGrace: grace(2500 * time.Millisecond),
	}, b)
}

func TestDecodeDoesNotValidate(t *testing.T) {
	b, err := bootstrap.Decode(strings.NewReader(`{"version":7}`))

	require.NoError(t, err)
	assert.ErrorIs(t, b.Validate(), bootstrap.ErrVersion)
}

func TestDecodeIsStrict(t *testing.T) {
	for _, tc := range []struct {
		name, doc, msg string
	}{
		{"trailing object", `{"version":1}{"version":1}`, "trailing data"},
		{"trailing garbage", `{"version":1} x`, "trailing data"},
		{"trailing array", `{"version":1}[]`, "trailing data"},
		{"version as string", `{"version":"1"}`, `field "version" has the wrong type`},
		{"version as float", `{"version":1.5}`, `has the wrong type`},
		{"hostname as number", `{"version":1,"hostname":5}`, `field "hostname" has the wrong type`},
		{"argv as string", `{"version":1,"daemon":{"argv":"/bin/true"}}`, `has the wrong type`},
		{"env as object", `{"version":1,"daemon":{"argv":["/bin/true"],"env":{"A":"1"}}}`, `has the wrong type`},
		{"daemon as array", `{"version":1,"daemon":[]}`, `has the wrong type`},
		{"stop_grace as number", `{"version":1,"stop_grace":6}`, ``},
		{"stop_grace unparsable", `{"version":1,"stop_grace":"soon"}`, ``},
		{"top level array", `[{"version":1}]`, `has the wrong type`},
		{"top level string", `"version"`, `has the wrong type`},
		{"empty input", ``, "unexpected end of input"},
		{"cut short", `{"version":1,"daemon":{"argv":[`, "unexpected end of input"},
		{"syntax error", `{"version" 1}`, "syntax error at byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bootstrap.Decode(strings.NewReader(tc.doc))

			assert.Nil(t, b)
			require.ErrorIs(t, err, bootstrap.ErrDecode)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestDecodeRefusesUnknownKeysWithoutEchoingThem(t *testing.T) {
	for name, doc := range map[string]string{
		"top level": `{"version":1,"user":"root"}`,
		"in daemon": `{"version":1,"daemon":{"argv":["/bin/true"],"uid":0}}`,
	} {
		t.Run(name, func(t *testing.T) {
			b, err := bootstrap.Decode(strings.NewReader(doc))
			assert.Nil(t, b)
			require.ErrorIs(t, err, bootstrap.ErrUnknownKey)
			assert.NotContains(t, err.Error(), "root")
		})
	}
}

func TestDecodeRefusesMoreThan256KiB(t *testing.T) {
	doc := `{"version":1}`
	exact := doc + strings.Repeat(" ", bootstrap.MaxSize-len(doc))
	over := exact + " "

	b, err := bootstrap.Decode(strings.NewReader(exact))
	require.NoError(t, err, "exactly MaxSize bytes is allowed")
	assert.Equal(t, 1, b.Version)

	_, err = bootstrap.Decode(strings.NewReader(over))
	require.ErrorIs(t, err, bootstrap.ErrTooLarge)

	// A stream that never ends is cut off after the limit, not read to the end.
	_, err = bootstrap.Decode(iotest.OneByteReader(bytes.NewReader(bytes.Repeat([]byte(" "), 10<<20))))
	require.ErrorIs(t, err, bootstrap.ErrTooLarge)
}

func TestDecodeReportsAReadError(t *testing.T) {
	_, err := bootstrap.Decode(iotest.ErrReader(errors.New("link down")))

	require.ErrorIs(t, err, bootstrap.ErrDecode)
	assert.Contains(t, err.Error(), "link down")
}

// Error messages are logged and shown: they name the rule, never the value
// that broke it, so a secret put in the wrong field does not leak.
func TestErrorsNeverContainTheSubmittedValue(t *testing.T) {
	const secret = "sk-live-51HkQ2eZvKYlo2C0secretTOKEN"
	for _, tc := range []struct {
		name, doc string
	}{
		{"secret as hostname", `{"version":1,"hostname":"` + secret + `"}`},
		{"secret as version", `{"version":"` + secret + `"}`},
		{"secret as program", `{"version":1,"daemon":{"argv":["` + secret + `"]}}`},
		{"secret in an argument with NUL", `{"version":1,"daemon":{"argv":["/bin/sh","` + secret + `\u0000"]}}`},
		{"secret as env without key", `{"version":1,"daemon":{"argv":["/bin/true"],"env":["` + secret + `"]}}`},
		{"secret as env with bad key", `{"version":1,"daemon":{"argv":["/bin/true"],"env":["API-KEY=` + secret + `"]}}`},
		{"secret as duplicate env", `{"version":1,"daemon":{"argv":["/bin/true"],"env":["K=` + secret + `","K=` + secret + `"]}}`},
		{"secret as env object", `{"version":1,"daemon":{"argv":["/bin/true"],"env":{"API_KEY":"` + secret + `"}}}`},
		{"secret as dir", `{"version":1,"daemon":{"argv":["/bin/true"],"dir":"` + secret + `"}}`},
		{"secret as stop_grace", `{"version":1,"stop_grace":"` + secret + `"}`},
		{"secret as value of unknown field", `{"version":1,"token":"` + secret + `"}`},
		{"secret as number field", `{"version":1,"hostname":["` + secret + `"]}`},
		{"secret before a syntax error", `{"version":1,"hostname":"` + secret + `" "x"}`},
		{"secret in trailing data", `{"version":1} "` + secret + `"`},
		{"secret cut short", `{"version":1,"hostname":"` + secret},
		{"secret with huge argv", `{"version":1,"daemon":{"argv":["/bin/true","` + secret + strings.Repeat("a", 64<<10) + `"]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bootstrap.Decode(strings.NewReader(tc.doc))
			if err == nil {
				err = b.Validate()
			}
			require.Error(t, err)
			assert.NotContains(t, err.Error(), secret)
			assert.NotContains(t, err.Error(), secret[:12])
		})
	}
}

func TestGraceDefaultsTo6Seconds(t *testing.T) {
	assert.Equal(t, 6*time.Second, (&bootstrap.Bootstrap{}).Grace())
	assert.Equal(t, 2*time.Second, (&bootstrap.Bootstrap{StopGrace: grace(2 * time.Second)}).Grace())
	assert.Equal(t, time.Duration(0), (&bootstrap.Bootstrap{StopGrace: grace(0)}).Grace(), "an explicit 0 kills at once")
}

func TestDurationIsWrittenAsAString(t *testing.T) {
	b := bootstrap.Bootstrap{Version: 1, StopGrace: grace(1500 * time.Millisecond)}

	out, err := json.Marshal(b)

	require.NoError(t, err)
	assert.JSONEq(t, `{"version":1,"stop_grace":"1.5s"}`, string(out))
	back, err := bootstrap.Decode(bytes.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, &b, back)
}

func TestEnvironAddsPATHAndHOMEOnlyWhenAbsent(t *testing.T) {
	p := &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"A=1"}}
	assert.Equal(t, []string{
		"A=1",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + bootstrap.RuntimeHome,
	}, p.Environ())

	p = &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"HOME=/root", "PATH=/opt/bin"}}
	assert.Equal(t, []string{"HOME=/root", "PATH=/opt/bin"}, p.Environ())

	// A key that merely starts with PATH is not PATH.
	p = &bootstrap.Process{Argv: []string{"/bin/true"}, Env: []string{"PATHX=1", "HOMES=2"}}
	assert.Len(t, p.Environ(), 4)
}

func TestEnvironDoesNotModifyTheProcess(t *testing.T) {
	env := make([]string, 1, 10) // spare capacity an append could scribble into
	env[0] = "A=1"
	p := &bootstrap.Process{Argv: []string{"/bin/true"}, Env: env}

	_ = p.Environ()

	assert.Equal(t, []string{"A=1"}, p.Env)
	assert.Equal(t, []string{"A=1"}, env[:1])
	assert.Empty(t, env[1:2][0], "Environ wrote into the caller's backing array")
}
