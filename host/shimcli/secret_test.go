package shimcli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

const (
	goodPassword = "s3cret-Made-By-The-Caller_0123456789"
	credBoot     = `{"version":1,"daemon":{"argv":["/usr/local/bin/daemon"]},"credentials":{"username_env":"U","password_env":"P"}}`
)

func TestThePasswordLineComesFirstAndLeavesTheRestOfStdinUntouched(t *testing.T) {
	commands := `{"id":"1","cmd":"status"}` + "\n"
	for name, in := range map[string]string{
		"newline":  goodPassword + "\n" + credBoot + "\n" + commands,
		"crlf":     goodPassword + "\r\n" + credBoot + "\n" + commands,
		"one byte": goodPassword + "\n" + credBoot + "\n" + commands,
	} {
		var r io.Reader = strings.NewReader(in)
		if name == "one byte" {
			r = iotest.OneByteReader(r)
		}
		pw, rest, err := readPasswordLine(r)
		require.NoError(t, err, name)
		assert.Equal(t, goodPassword, pw, name)

		// The bootstrap and the commands follow, as without the password.
		f := &runFlags{bootFile: "-", bootFormat: formatOAC, control: "stdin"}
		boot, rest, err := loadBootstrap(f, rest)
		require.NoError(t, err, name)
		assert.Equal(t, "U", boot.Credentials.UsernameEnv, name)
		left, err := io.ReadAll(rest)
		require.NoError(t, err)
		assert.Equal(t, "\n"+commands, string(left), name)
	}
}

func TestThePasswordMayBeAsLongAsTheBootstrapAllows(t *testing.T) {
	longest := strings.Repeat("z", bootstrap.MaxPassword)
	for _, end := range []string{"\n", "\r\n", ""} {
		pw, _, err := readPasswordLine(strings.NewReader(longest + end + "next"))
		if end == "" {
			assert.ErrorContains(t, err, "longer than 1024", "no line end: the next bytes are the line's")
			continue
		}
		require.NoError(t, err, "%q", end)
		assert.Equal(t, longest, pw)
	}
	pw, _, err := readPasswordLine(strings.NewReader(strings.Repeat("z", bootstrap.MinPassword) + "\n"))
	require.NoError(t, err)
	assert.Len(t, pw, bootstrap.MinPassword)
}

func TestThePasswordLineMayBeAllOfStdin(t *testing.T) {
	pw, rest, err := readPasswordLine(strings.NewReader(goodPassword))
	require.NoError(t, err)
	assert.Equal(t, goodPassword, pw)
	left, err := io.ReadAll(rest)
	require.NoError(t, err)
	assert.Empty(t, left)
}

func TestABadPasswordLineIsRefusedWithoutEchoingIt(t *testing.T) {
	long := strings.Repeat("x", bootstrap.MaxPassword+1)
	for _, tc := range []struct{ in, says string }{
		{"", "stdin ended before the password line"},
		{"\n", "the password line has 0 characters"},
		{strings.Repeat("y", 15) + "\n", "the password line has 15 characters"},
		{"short-secret\n", "the password line has 12 characters"},
		{long + "\n", "the password line has 1025 characters"},
		{long + "\r\n", "the first line of stdin is longer than 1024 characters"},
		{long + "x\n", "the first line of stdin is longer than 1024 characters"},
		{long + long, "the first line of stdin is longer than 1024 characters"},
		{"a password with spaces in it\n", "character 2 of the password line is a space"},
		{"tab\tseparated-password\n", "character 4 of the password line is a control character"},
		{"pässwörd-pässwörd-pässwörd\n", "character 2 of the password line is not ASCII"},
		{"nul\x00-in-the-password-line\n", "character 4 of the password line is a control character"},
		{"del\x7f-in-the-password-line\n", "character 4 of the password line is a control character"},
	} {
		_, _, err := readPasswordLine(strings.NewReader(tc.in))
		require.Error(t, err, "%q", tc.in)
		assert.ErrorContains(t, err, tc.says, "%q", tc.in)
		assert.Contains(t, err.Error(), "16 to 1024 printable ASCII characters without spaces, then a newline", "the error says the rule")
		assert.Equal(t, api.CodeInvalidConfig, failure.Code(err))
		if line := strings.TrimSpace(tc.in); len(line) > 3 {
			assert.NotContains(t, err.Error(), line, "the line is never echoed")
		}
	}
}

func TestThePasswordLineIsReadNoFurtherThanItsBound(t *testing.T) {
	// An endless line: the reader stops after the bound, not at the end.
	r := &countingReader{r: iotest.OneByteReader(infinite('x'))}
	_, _, err := readPasswordLine(r)
	assert.ErrorContains(t, err, "longer than 1024")
	assert.Equal(t, bootstrap.MaxPassword+2, r.n, "the longest line it takes is the password, '\\r' and one byte more")
}

func TestNoStdinAtAllIsAnEmptyOne(t *testing.T) {
	_, _, err := readPasswordLine(nil)
	assert.ErrorContains(t, err, "--password-stdin: stdin ended before the password line")
}

func TestAStdinThatFailsIsReported(t *testing.T) {
	_, _, err := readPasswordLine(iotest.ErrReader(errors.New("pipe broke")))
	assert.ErrorContains(t, err, "--password-stdin: read stdin: pipe broke")
}

func TestThePasswordGoesIntoACopyOfTheBootstrapsCredentials(t *testing.T) {
	boot, err := bootstrap.Decode(strings.NewReader(credBoot))
	require.NoError(t, err)
	got, err := withPassword(boot, goodPassword)
	require.NoError(t, err)
	assert.Equal(t, goodPassword, got.Credentials.Password)
	assert.Empty(t, boot.Credentials.Password, "the decoded bootstrap is not changed")
	require.NoError(t, got.Validate())
	require.NoError(t, got.ValidateInGuest(), "the guest takes it for a password the host set")
}

func TestThePasswordOnStdinNeedsCredentialsAndNoOtherPassword(t *testing.T) {
	_, err := withPassword(nil, goodPassword)
	assert.ErrorContains(t, err, "the bootstrap has no credentials")
	_, err = withPassword(&bootstrap.Bootstrap{Version: 1}, goodPassword)
	assert.ErrorContains(t, err, "add credentials with username_env and password_env, or drop --password-stdin")

	withOwn := strings.Replace(credBoot, `"username_env"`, `"password":"the-bootstraps-own-password","username_env"`, 1)
	boot, err := bootstrap.Decode(strings.NewReader(withOwn))
	require.NoError(t, err)
	_, err = withPassword(boot, goodPassword)
	assert.ErrorContains(t, err, "the bootstrap carries credentials.password too (drop one")
	assert.NotContains(t, err.Error(), goodPassword)
	assert.NotContains(t, err.Error(), "the-bootstraps-own-password")
	assert.Equal(t, api.CodeInvalidConfig, failure.Code(err))
}

func TestPasswordStdinRefusesTheOtherPasswordFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--password-stdin", "--bootstrap", "-", "--password-fd", "3"}, "--password-stdin and --password-fd both concern the daemon's password: drop --password-fd"},
		{[]string{"--password-stdin", "--bootstrap", "-", "--password-file", "/tmp/pw"}, "--password-stdin and --password-file both concern the daemon's password: drop --password-file"},
		{[]string{"--password-stdin"}, "--password-stdin needs --bootstrap"},
	} {
		for _, cmd := range []string{"run", "start"} {
			var stdout, stderr bytes.Buffer
			args := append([]string{cmd, "--name", "x"}, tc.args...)
			assert.Equal(t, 2, Main(args, strings.NewReader(goodPassword+"\n"), &stdout, &stderr), args)
			assert.Contains(t, stderr.String(), "oac-shim "+cmd+": "+tc.err, args)
			assert.Empty(t, stdout.String(), "a usage error: no event")
		}
	}
}

// setHostOS makes the shim take the host for goos for the test.
func setHostOS(t *testing.T, goos string) {
	old := hostOS
	hostOS = goos
	t.Cleanup(func() { hostOS = old })
}

func TestOnWindowsTheDescriptorFlagsNameTheirStdinReplacement(t *testing.T) {
	setHostOS(t, "windows")
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--bootstrap", "-", "--password-fd", "3"}, "--password-fd: a program on Windows inherits no descriptor but stdin, stdout and stderr; make the password yourself and hand it in as the first line of stdin with --password-stdin"},
		{[]string{"--bootstrap", "fd:3"}, "--bootstrap fd:N: a program on Windows inherits no descriptor but stdin, stdout and stderr; hand the bootstrap on stdin with --bootstrap -"},
	} {
		for _, cmd := range []string{"run", "start"} {
			var stdout, stderr bytes.Buffer
			args := append([]string{cmd, "--name", "x"}, tc.args...)
			assert.Equal(t, 2, Main(args, nil, &stdout, &stderr), args)
			assert.Contains(t, stderr.String(), tc.err, args)
		}
	}
	// What replaces them parses there.
	var stderr bytes.Buffer
	f, code := parseRunFlags("run", []string{"--name", "x", "--bootstrap", "-", "--password-stdin"}, &stderr)
	require.Zero(t, code, stderr.String())
	assert.True(t, f.passwordStdin)
}

func TestOffWindowsTheDescriptorFlagsStillParse(t *testing.T) {
	for _, goos := range []string{"linux", "darwin"} {
		setHostOS(t, goos)
		var stderr bytes.Buffer
		f, code := parseRunFlags("run", []string{"--name", "x", "--bootstrap", "fd:3", "--password-fd", "4"}, &stderr)
		require.Zero(t, code, stderr.String())
		assert.Equal(t, 4, f.passwordFD)
		assert.Nil(t, descriptorRefusal(goos, "--password-fd", "x"))
	}
}

func TestABadPasswordLineCreatesNothingAndSaysWhy(t *testing.T) {
	registerFailing(t)
	var stdout, stderr bytes.Buffer
	in := "not a password at all\n" + credBoot + "\n"
	code := Main([]string{"run", "--provider", "failing-test", "--name", "x", "--agent", "/nonexistent",
		"--password-stdin", "--bootstrap", "-"}, strings.NewReader(in), &stdout, &stderr)
	assert.Equal(t, api.FailureOf(api.CodeInvalidConfig).Exit, code)
	events := decodeEvents(t, stdout.String())
	require.Len(t, events, 1, "one event, failed: nothing was created")
	assert.Equal(t, api.StateFailed, events[0].State)
	assert.Equal(t, api.CodeInvalidConfig, events[0].Code)
	assert.Contains(t, events[0].Message, "nothing created: --password-stdin: character 4 of the password line is a space")
	assert.NotContains(t, stderr.String(), "no runtime here", "the provider was never asked")
	assert.NotContains(t, stdout.String()+stderr.String(), "not a password at all")
}

func TestAGoodPasswordLineReachesTheProvidersCreate(t *testing.T) {
	registerFailing(t)
	var stdout, stderr bytes.Buffer
	in := goodPassword + "\n" + credBoot + "\n"
	code := Main([]string{"run", "--provider", "failing-test", "--name", "x", "--agent", "/nonexistent",
		"--password-stdin", "--bootstrap", "-"}, strings.NewReader(in), &stdout, &stderr)
	assert.Equal(t, api.FailureOf(api.CodeRuntimeFailed).Exit, code, stderr.String())
	assert.Contains(t, stderr.String(), "no runtime here", "past the password and the bootstrap to Create")
	assert.NotContains(t, stdout.String()+stderr.String(), goodPassword)
}

func decodeEvents(t *testing.T, out string) []api.Event {
	t.Helper()
	var evs []api.Event
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e api.Event
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		evs = append(evs, e)
	}
	return evs
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type infinite byte

func (b infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
