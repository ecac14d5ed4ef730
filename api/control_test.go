package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeAcceptsEachCommand(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Command
	}{
		{`{"cmd":"status"}`, Command{Cmd: CmdStatus}},
		{`{"id":"7","cmd":"stop"}`, Command{ID: "7", Cmd: CmdStop}},
		{` {"cmd":"start"} `, Command{Cmd: CmdStart}},
		{`{"cmd":"reset","id":""}`, Command{Cmd: CmdReset}},
		{`{"cmd":"push_time"}`, Command{Cmd: CmdPushTime}},
		{`{"cmd":"set_policy","allow":["a.example.com:443"],"upstreams":["llm:443=127.0.0.1:8443"]}`,
			Command{Cmd: CmdSetPolicy, Allow: []string{"a.example.com:443"}, Upstreams: []string{"llm:443=127.0.0.1:8443"}}},
		{`{"cmd":"set_policy","allow":[]}`, Command{Cmd: CmdSetPolicy, Allow: []string{}}},
		{`{"cmd":"set_policy"}`, Command{Cmd: CmdSetPolicy}},
		{`{"cmd":"add_forward","listen":"127.0.0.1:0","guest_port":4096}`, Command{Cmd: CmdAddForward, Listen: "127.0.0.1:0", GuestPort: 4096}},
		{`{"cmd":"remove_forward","listen":"/run/x.sock"}`, Command{Cmd: CmdRemoveForward, Listen: "/run/x.sock"}},
		{`{"c\u006dd":"status"}`, Command{Cmd: CmdStatus}},
		{`{"cmd":"claim","bootstrap":{"version":1}}`, Command{Cmd: CmdClaim, Bootstrap: json.RawMessage(`{"version":1}`)}},
		{`{"id":"c1","cmd":"claim","bootstrap":{"version":1,"hostname":"demo"},"allow":["a.example.com:443"],"upstreams":["llm:443=127.0.0.1:8443"],` +
			`"forwards":[{"listen":"127.0.0.1:0","guest_port":4096},{"guest_port":22,"listen":"/run/ssh.sock"}]}`,
			Command{ID: "c1", Cmd: CmdClaim, Bootstrap: json.RawMessage(`{"version":1,"hostname":"demo"}`),
				Allow: []string{"a.example.com:443"}, Upstreams: []string{"llm:443=127.0.0.1:8443"},
				Forwards: []ForwardSpec{{Listen: "127.0.0.1:0", GuestPort: 4096}, {Listen: "/run/ssh.sock", GuestPort: 22}}}},
	} {
		got, err := Decode([]byte(tc.line))
		require.NoError(t, err, tc.line)
		assert.Equal(t, tc.want, got, tc.line)
	}
}

func TestDecodeRefusesWithTheRuleNotTheValue(t *testing.T) {
	for _, tc := range []struct{ line, err string }{
		{``, "one JSON object"},
		{`[]`, "one JSON object"},
		{`"status"`, "one JSON object"},
		{`{"cmd":"status"} {"cmd":"stop"}`, "trailing data"},
		{`{"cmd":"status"}x`, "trailing data"},
		{`{"cmd":"status"`, "malformed JSON"},
		{`{"cmd":"status",}`, "malformed JSON"},
		{`{}`, `"cmd" is required`},
		{`{"cmd":""}`, `"cmd" is required`},
		{`{"cmd":"SECRETcommand"}`, `unknown command "SECRETcommand"`},
		{`{"cmd":"Status"}`, "unknown command"},
		{`{"Cmd":"status"}`, `"cmd" is required`},
		{`{"cmd":"status","Cmd":"status"}`, `status takes no key "Cmd"`},
		{`{"cmd":"status","cmd":"stop"}`, `key "cmd" given twice`},
		{`{"cmd":"status","listen":"x"}`, `status takes no key "listen"`},
		{`{"cmd":"status","extra":1}`, `status takes no key "extra"`},
		{`{"cmd":1}`, `"cmd" must be a string`},
		{`{"cmd":null}`, `"cmd" must be a string`},
		{`{"cmd":"status","id":7}`, `"id" must be a string`},
		{`{"cmd":"status","id":"` + strings.Repeat("x", 65) + `"}`, "id must be at most 64 bytes"},
		{`{"cmd":"status","id":"a\nb"}`, "control characters"},
		{`{"cmd":"add_forward","listen":"127.0.0.1:0"}`, `add_forward needs "guest_port"`},
		{`{"cmd":"add_forward","guest_port":1}`, `add_forward needs "listen"`},
		{`{"cmd":"add_forward","listen":"l","guest_port":"4096"}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":4096.0}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":4e3}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":-1}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":0}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":65536}`, "integer 1..65535"},
		{`{"cmd":"add_forward","listen":"l","guest_port":04096}`, "malformed JSON"},
		{`{"cmd":"add_forward","listen":"","guest_port":1}`, `"listen" must not be empty`},
		{`{"cmd":"add_forward","listen":["l"],"guest_port":1}`, `"listen" must be a string`},
		{`{"cmd":"set_policy","allow":"a:443"}`, `"allow" must be a list of strings`},
		{`{"cmd":"set_policy","allow":[1]}`, `"allow" must be a list of strings`},
		{`{"cmd":"set_policy","allow":[null]}`, `"allow" must be a list of strings`},
		{`{"cmd":"set_policy","upstreams":null}`, `"upstreams" must be a list of strings`},
		{`{"cmd":"set_policy","allow":[` + strings.Repeat(`"a",`, 512) + `"a"]}`, "more than 512 items"},
		{"{\"cmd\":\"status\xff\"}", "not UTF-8"},
		{`{"cmd":"` + strings.Repeat("x", MaxLine) + `"}`, "longer than"},
	} {
		_, err := Decode([]byte(tc.line))
		require.ErrorIs(t, err, ErrBadCommand, tc.line)
		assert.Contains(t, err.Error(), tc.err, tc.line)
		assert.Equal(t, answerCodeOf(tc.err), AnswerCode(err), tc.line)
		assert.NotContains(t, err.Error(), "a:443")
		assert.Less(t, len(err.Error()), 300)
	}
}

// A claim's bootstrap is kept as the bytes the caller sent, for the shim
// to decode as --bootstrap does: the decoder holds it to being an object
// and no more, so what is wrong inside it is the shim's to say.
func TestDecodeKeepsAClaimsBootstrapAsSent(t *testing.T) {
	c, err := Decode([]byte(`{"cmd":"claim","bootstrap":{ "version" : 1, "hostname": "<demo>", "unknown": [1, {"x": null}] }}`))
	require.NoError(t, err)
	assert.Equal(t, `{ "version" : 1, "hostname": "<demo>", "unknown": [1, {"x": null}] }`, string(c.Bootstrap))
	assert.Empty(t, c.Forwards, "no forwards asked")

	c, err = Decode([]byte(`{"cmd":"claim","bootstrap":{},"forwards":[]}`))
	require.NoError(t, err)
	assert.Equal(t, `{}`, string(c.Bootstrap))
	assert.Empty(t, c.Forwards)
}

// A claim with bad input is refused with invalid_argument (the sandbox
// stays warm), naming the rule and never the value.
func TestDecodeRefusesABadClaimWithInvalidArgument(t *testing.T) {
	forward := `{"listen":"127.0.0.1:0","guest_port":4096}`
	for _, tc := range []struct{ line, err string }{
		{`{"cmd":"claim"}`, `claim needs "bootstrap"`},
		{`{"cmd":"claim","allow":["a.example.com:443"]}`, `claim needs "bootstrap"`},
		{`{"cmd":"claim","bootstrap":"{\"version\":1}"}`, `"bootstrap" must be an object`},
		{`{"cmd":"claim","bootstrap":[{"version":1}]}`, `"bootstrap" must be an object`},
		{`{"cmd":"claim","bootstrap":null}`, `"bootstrap" must be an object`},
		{`{"cmd":"claim","bootstrap":1}`, `"bootstrap" must be an object`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"SECRET:1"}]}`, `"forwards" must be a list of {"listen","guest_port"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"guest_port":4096}]}`, `"forwards" must be a list of {"listen","guest_port"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"SECRET:1","guest_port":4096,"url":"x"}]}`, `"forwards" must be a list of {"listen","guest_port"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[null]}`, `"forwards" must be a list of {"listen","guest_port"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":["SECRET:1=4096"]}`, `"forwards" must be a list of {"listen","guest_port"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"SECRET:1","guest_port":0}]}`, `each of "forwards" needs "listen" and a "guest_port" 1..65535`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"SECRET:1","guest_port":65536}]}`, `each of "forwards" needs "listen" and a "guest_port" 1..65535`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[` + forward + `,{"listen":"","guest_port":4096}]}`, `each of "forwards" needs "listen" and a "guest_port" 1..65535`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"SECRET:1","guest_port":"4096"}]}`, `"guest_port" must be an integer 1..65535`},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[` + strings.Repeat(forward+",", 64) + forward + `]}`, `"forwards" has more than`},
		{`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/etc","host":"/SECRET"}]}`, `each of "volumes" needs a "guest" of "/home" or "/environment"`},
		{`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/home","host":""}]}`, `each of "volumes" needs a "host" directory`},
		{`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/home"}]}`, `"volumes" must be a list of {"guest","host"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"volumes":{"/home":"/SECRET"}}`, `"volumes" must be a list of {"guest","host"} objects`},
		{`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/home","host":"/a"},{"guest":"/environment","host":"/b"},{"guest":"/home","host":"/c"}]}`, `"volumes" has more than 2 items`},
		{`{"cmd":"claim","bootstrap":{"version":1},"allow":"SECRET:443"}`, `"allow" must be a list of strings`},
		{`{"cmd":"claim","bootstrap":{"version":1},"listen":"SECRET:1"}`, `claim takes no key "listen"`},
		{`{"cmd":"claim","bootstrap":{"version":1},"guest_port":4096}`, `claim takes no key "guest_port"`},
		{`{"cmd":"claim","bootstrap":{"version":1},"Bootstrap":{}}`, `claim takes no key "Bootstrap"`},
		{`{"cmd":"claim","bootstrap":{"version":1},"policy":{}}`, `claim takes no key "policy"`},
		{`{"cmd":"set_policy","bootstrap":{"version":1}}`, `set_policy takes no key "bootstrap"`},
		{`{"cmd":"add_forward","listen":"l","guest_port":1,"forwards":[]}`, `add_forward takes no key "forwards"`},
	} {
		_, err := Decode([]byte(tc.line))
		require.ErrorIs(t, err, ErrBadCommand, tc.line)
		assert.Contains(t, err.Error(), tc.err, tc.line)
		assert.Equal(t, AnswerInvalidArgument, AnswerCode(err), tc.line)
		assert.NotContains(t, err.Error(), "SECRET")
	}
	// 64 forwards, the most a claim takes, are taken.
	_, err := Decode([]byte(`{"cmd":"claim","bootstrap":{"version":1},"forwards":[` + strings.Repeat(forward+",", 63) + forward + `]}`))
	assert.NoError(t, err, "64 forwards")
}

// answerCodeOf is the answer code a refusal worded so must carry: the
// line is not a command, names none, or the command's keys are wrong.
func answerCodeOf(msg string) string {
	switch {
	case strings.Contains(msg, "unknown command"):
		return AnswerUnknownCommand
	case msg == "malformed JSON":
		return AnswerInvalidCommand
	}
	for _, arg := range []string{"takes no key", " needs ", "integer 1..65535", "must not be empty", `"listen" must be a string`, "list of strings", "more than 512 items"} {
		if strings.Contains(msg, arg) {
			return AnswerInvalidArgument
		}
	}
	return AnswerInvalidCommand
}

func TestAnswerCodeOfAnErrorWithoutOneIsFailed(t *testing.T) {
	assert.Equal(t, "", AnswerCode(nil))
	assert.Equal(t, AnswerFailed, AnswerCode(errors.New("x")))
	err := fmt.Errorf("wrapped: %w", Refuse(AnswerNotFound, errors.New("no such forward")))
	assert.Equal(t, AnswerNotFound, AnswerCode(err))
	assert.Equal(t, "wrapped: no such forward", err.Error(), "the message is unchanged")
	assert.Nil(t, Refuse(AnswerFailed, nil))
}

func TestARefusedLineStillNamesItsIDAndCommandWhenItGivesThemPlainly(t *testing.T) {
	for _, line := range []string{
		`{"id":"c1","cmd":"claim","bootstrap":[1]}`,
		`{"id":"c1","cmd":"claim","bootstrap":{},"forwards":null}`,
		`{"id":"c1","cmd":"add_forward","listen":"127.0.0.1:0","guest_port":"1"}`,
	} {
		c, err := Decode([]byte(line))
		require.Error(t, err, line)
		assert.Equal(t, "c1", c.ID, "the answer can name the caller's id: %s", line)
		assert.NotEmpty(t, c.Cmd, line)
		assert.Equal(t, AnswerInvalidArgument, AnswerCode(err), line)
	}
	c, err := Decode([]byte(`{"id":"c1","cmd":"claim","bootstrap":{},"forwards":[` + strings.Repeat(`{"listen":"127.0.0.1:0","guest_port":1},`, 64) + `{"listen":"127.0.0.1:0","guest_port":1}]}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"forwards" has more than 64 items`)
	assert.Equal(t, "c1", c.ID)
}
