package shimcli

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

func TestTheBootstrapOnStdinLeavesTheCommandsForTheControlAPI(t *testing.T) {
	in := strings.NewReader("{\"version\": 1,\n \"hostname\": \"demo\"}\n{\"id\":\"1\",\"cmd\":\"status\"}\n{\"cmd\":\"stop\"}\n")
	f := &runFlags{bootFile: "-", bootFormat: formatOAC, control: "stdin"}
	boot, rest, err := loadBootstrap(f, in)
	require.NoError(t, err)
	assert.Equal(t, "demo", boot.Hostname)
	left, err := io.ReadAll(rest)
	require.NoError(t, err)
	assert.Equal(t, "\n{\"id\":\"1\",\"cmd\":\"status\"}\n{\"cmd\":\"stop\"}\n", string(left))
}

func TestTheBootstrapOnStdinWithoutControlIsAllOfStdin(t *testing.T) {
	f := &runFlags{bootFile: "-", bootFormat: formatOAC}
	_, _, err := loadBootstrap(f, strings.NewReader(`{"version":1} {"version":1}`))
	assert.ErrorIs(t, err, bootstrap.ErrDecode, "trailing data")
	boot, _, err := loadBootstrap(f, strings.NewReader(`{"version":1}`))
	require.NoError(t, err)
	assert.Equal(t, 1, boot.Version)
}

func TestABootstrapOnStdinIsBoundedAndStrict(t *testing.T) {
	f := &runFlags{bootFile: "-", bootFormat: formatOAC, control: "stdin"}
	huge := `{"version":1,"hostname":"` + strings.Repeat("a", bootstrap.MaxSize) + `"}`
	_, _, err := loadBootstrap(f, strings.NewReader(huge))
	assert.ErrorIs(t, err, bootstrap.ErrTooLarge)
	_, _, err = loadBootstrap(f, strings.NewReader(`{"version":1,"Version":1}`+"\n"))
	assert.ErrorIs(t, err, bootstrap.ErrUnknownKey)
	_, _, err = loadBootstrap(f, strings.NewReader(`{"version":`))
	assert.ErrorIs(t, err, bootstrap.ErrDecode)
	_, _, err = loadBootstrap(f, strings.NewReader(``))
	assert.ErrorIs(t, err, bootstrap.ErrDecode)
}

func TestCoresShapeOnStdin(t *testing.T) {
	f := &runFlags{bootFile: "-", bootFormat: formatCore, control: "stdin"}
	boot, _, err := loadBootstrap(f, strings.NewReader(`{"runtime":{"command":["/bin/sleep","1000"],"env":{"B":"2","A":"1"}}}`+"\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"/bin/sleep", "1000"}, boot.Daemon.Argv)
	assert.Equal(t, []string{"A=1", "B=2"}, boot.Daemon.Env)
}

func TestBootstrapAndPasswordDescriptorFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--bootstrap", "fd:1"}, "not a descriptor of 3 or more"},
		{[]string{"--bootstrap", "fd:x"}, "not a descriptor"},
		{[]string{"--password-fd", "2"}, "not a descriptor of 3 or more"},
		{[]string{"--bootstrap-format", "yaml"}, `--bootstrap-format takes "oac" or "core"`},
	} {
		var stderr bytes.Buffer
		f, code := parseRunFlags("run", append([]string{"--name", "x"}, tc.args...), &stderr)
		assert.Nil(t, f, tc.args)
		assert.Equal(t, 2, code, tc.args)
		assert.Contains(t, stderr.String(), tc.err, tc.args)
	}
	var stderr bytes.Buffer
	f, code := parseRunFlags("run", []string{"--name", "x", "--bootstrap", "fd:7", "--password-fd", "9"}, &stderr)
	require.Zero(t, code, stderr.String())
	assert.Equal(t, 9, f.passwordFD)
}

func TestADescriptorThatIsNotOpenIsAConfigurationError(t *testing.T) {
	_, err := openFD(987, "--password-fd")
	assert.ErrorContains(t, err, "descriptor 987 is not open")
}
