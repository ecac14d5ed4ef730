package bootstrap_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// FuzzBootstrapDecode decodes and validates arbitrary documents as the
// guest does with what the host sends. It must never panic, fail only with
// the package's sentinels, and an accepted Bootstrap must survive the trip
// the host makes it take (json.Marshal, then Decode and Validate again)
// unchanged.
func FuzzBootstrapDecode(f *testing.F) {
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"hostname":"box","daemon":{"argv":["/bin/sleep","1"],"env":["A=1"],"dir":"/tmp"},"stop_grace":"1.5s"}`))
	f.Add([]byte(`{"version":1,"daemon":{"argv":["/bin/true"],"env":[]}}`))
	f.Add([]byte(`{"version":1,"stop_grace":"-1s"}`))
	f.Add([]byte(`{"version":1,"unknown":true}`))
	f.Add([]byte(`{"version":1} {}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := bootstrap.Decode(bytes.NewReader(data))
		if err != nil {
			require.Nil(t, b)
			require.True(t, errors.Is(err, bootstrap.ErrDecode) || errors.Is(err, bootstrap.ErrTooLarge), "unexpected error %v", err)
			return
		}
		if err := b.Validate(); err != nil {
			require.True(t, isRuleError(err), "unexpected error %v", err)
			return
		}
		_ = b.Grace()
		if b.Daemon != nil {
			_ = b.Daemon.Environ()
		}

		enc, err := json.Marshal(b)
		require.NoError(t, err)
		again, err := bootstrap.Decode(bytes.NewReader(enc))
		require.NoError(t, err, "re-encoded %s", enc)
		require.NoError(t, again.Validate(), "re-encoded %s", enc)
		require.Equal(t, normalize(b), again)
		enc2, err := json.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(enc2))
	})
}

func isRuleError(err error) bool {
	for _, e := range []error{
		bootstrap.ErrVersion, bootstrap.ErrHostname, bootstrap.ErrArgv, bootstrap.ErrEnv,
		bootstrap.ErrArgsSize, bootstrap.ErrDir, bootstrap.ErrStopGrace,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// normalize maps the one difference JSON cannot carry: an empty env list is
// omitted on encoding and comes back as nil.
func normalize(b *bootstrap.Bootstrap) *bootstrap.Bootstrap {
	if b.Daemon != nil && len(b.Daemon.Env) == 0 {
		b.Daemon.Env = nil
	}
	return b
}
