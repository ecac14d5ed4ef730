package shimcli

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
)

func TestSIGHUPReloadsThePolicyAndKeepsTheOldOneOnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"version":1,"allow":["a.example.com:443"]}`), 0o600))
	pol, err := egress.LoadPolicy(file, []string{"flag.example.com:443"}, nil)
	require.NoError(t, err)
	b := egress.New(egress.Config{Policy: pol})

	var mu sync.Mutex
	var got []api.Event
	sink := api.Func(func(e api.Event) { mu.Lock(); got = append(got, e); mu.Unlock() })
	hups := make(chan os.Signal)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go reloadOnHUP(ctx, hups, "sb", file, []string{"flag.example.com:443"}, nil, b, sink, slog.New(slog.DiscardHandler))

	require.NoError(t, os.WriteFile(file, []byte(`{"version":1,"allow":["b.example.com:443"]}`), 0o600))
	hups <- nil
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]string{"b.example.com:443", "flag.example.com:443"}, b.Policy().Rules())
	}, 5*time.Second, 5*time.Millisecond)

	require.NoError(t, os.WriteFile(file, []byte(`{"version":1,"allow":["0.0.0.0/0:443"]}`), 0o600))
	hups <- nil
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{"b.example.com:443", "flag.example.com:443"}, b.Policy().Rules(), "a bad file keeps the old policy")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, api.KindEgressPolicy, got[0].Event)
	assert.Equal(t, "sb", got[0].Sandbox)
	assert.Contains(t, got[0].Message, "egress policy replaced: deny by default; 2 rules, 0 upstreams")
	assert.Contains(t, got[1].Message, "policy reload failed, previous policy kept")
}

func TestRunRefusesABadPolicyAsAUsageError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Main([]string{"run", "--name", "x", "--allow", "*:443"}, nil, &stdout, &stderr)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr.String(), "there is no allow-all")
	code = Main([]string{"run", "--name", "x", "--upstream", "llm:443"}, nil, &stdout, &stderr)
	assert.Equal(t, 2, code)
	assert.True(t, strings.Contains(stderr.String(), "NAME:PORT=ADDR"))
}
