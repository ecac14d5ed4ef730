package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecode feeds arbitrary lines to the command decoder, as a client of
// the control socket could. It must never panic; an accepted command is a
// known one, its line is one valid JSON object, its fields respect their
// bounds, and it re-encodes to a command that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"cmd":"status"}`, `{"id":"1","cmd":"stop"}`, `{"cmd":"start"}`, `{"cmd":"reset"}`, `{"cmd":"push_time"}`,
		`{"cmd":"set_policy","allow":["a.example.com:443"],"upstreams":["llm:443=127.0.0.1:8443"]}`,
		`{"cmd":"add_forward","listen":"127.0.0.1:0","guest_port":4096}`,
		`{"cmd":"remove_forward","listen":"/run/oac/d.sock"}`,
		`{"id":"c1","cmd":"claim","bootstrap":{"version":1,"hostname":"demo"},"allow":["a.example.com:443"],"forwards":[{"listen":"127.0.0.1:0","guest_port":4096}]}`,
		`{"cmd":"claim","bootstrap":{ "version" : 1, "x":"<&>"},"forwards":[]}`, `{"cmd":"claim","bootstrap":"{}"}`,
		`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/home","host":"/srv/t1/home"},{"guest":"/environment","host":"/srv/t1/env"}]}`,
		`{"cmd":"claim","bootstrap":{"version":1},"volumes":[{"guest":"/etc","host":""},{"host":1}]}`,
		`{"cmd":"status","cmd":"stop"}`, `{"cmd":"add_forward","listen":"x","guest_port":1e3}`,
		`{"cmd":"status"} {}`, `[`, `{"c\u006dd":"status"}`, "{\"cmd\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		c, err := Decode(line)
		if err != nil {
			require.ErrorIs(t, err, ErrBadCommand)
			require.Less(t, len(err.Error()), 400)
			return
		}
		require.True(t, json.Valid(line))
		_, known := keys[c.Cmd]
		require.True(t, known)
		require.LessOrEqual(t, len(c.ID), MaxID)
		if c.Cmd == CmdAddForward {
			require.True(t, c.GuestPort >= 1 && c.GuestPort <= 65535)
		} else {
			require.Zero(t, c.GuestPort)
		}
		if c.Cmd == CmdClaim {
			var doc map[string]any
			require.NoError(t, json.Unmarshal(c.Bootstrap, &doc), "a claim's bootstrap is one JSON object")
			require.NotNil(t, doc)
			require.LessOrEqual(t, len(c.Forwards), maxForwards)
			for _, f := range c.Forwards {
				require.NotEmpty(t, f.Listen)
				require.True(t, f.GuestPort >= 1 && f.GuestPort <= 65535)
			}
			require.LessOrEqual(t, len(c.Volumes), maxVolumes)
			for _, v := range c.Volumes {
				require.Contains(t, []string{"/home", "/environment"}, v.Guest)
				require.NotEmpty(t, v.Host)
			}
		} else {
			require.Nil(t, c.Bootstrap)
			require.Nil(t, c.Forwards)
			require.Nil(t, c.Volumes)
		}
		again, err := json.Marshal(c)
		require.NoError(t, err)
		c2, err := Decode(again)
		require.NoError(t, err, "%s", again)
		if len(c.Allow) == 0 && len(c2.Allow) == 0 {
			c.Allow, c2.Allow = nil, nil
		}
		if len(c.Upstreams) == 0 && len(c2.Upstreams) == 0 {
			c.Upstreams, c2.Upstreams = nil, nil
		}
		if len(c.Forwards) == 0 && len(c2.Forwards) == 0 {
			c.Forwards, c2.Forwards = nil, nil
		}
		if len(c.Volumes) == 0 && len(c2.Volumes) == 0 {
			c.Volumes, c2.Volumes = nil, nil
		}
		if c.Bootstrap != nil {
			// Re-encoding compacts the document (and escapes <, >, &): the
			// same JSON, other bytes.
			require.JSONEq(t, string(c.Bootstrap), string(c2.Bootstrap))
			c.Bootstrap, c2.Bootstrap = nil, nil
		}
		require.Equal(t, c, c2)
	})
}
