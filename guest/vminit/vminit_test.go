//go:build linux

package vminit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fakeSys(t *testing.T, ports map[string]string) (sys, dev string) {
	t.Helper()
	root := t.TempDir()
	sys, dev = filepath.Join(root, "sys"), filepath.Join(root, "dev")
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "class", "virtio-ports"), 0o755))
	require.NoError(t, os.MkdirAll(dev, 0o755))
	for port, name := range ports {
		d := filepath.Join(sys, "class", "virtio-ports", port)
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "name"), []byte(name+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dev, port), nil, 0o600))
	}
	return sys, dev
}

func TestFindVirtioPortByName(t *testing.T) {
	sys, dev := fakeSys(t, map[string]string{"vport1p1": "org.qemu.guest_agent.0", "vport2p1": "oac.agent"})
	p, err := FindVirtioPort(sys, dev, "oac.agent")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dev, "vport2p1"), p)

	_, err = FindVirtioPort(sys, dev, "other")
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorContains(t, err, `no virtio-serial port named "other" (ports: org.qemu.guest_agent.0, oac.agent)`)

	_, err = FindVirtioPort(filepath.Join(sys, "missing"), dev, "oac.agent")
	assert.ErrorContains(t, err, "is virtio_console loaded?")
}

func TestWaitVirtioPortWaitsForTheDeviceNode(t *testing.T) {
	sys, dev := fakeSys(t, map[string]string{"vport1p1": "oac.agent"})
	require.NoError(t, os.Remove(filepath.Join(dev, "vport1p1")))
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(dev, "vport1p1"), nil, 0o600)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := WaitVirtioPort(ctx, sys, dev, "oac.agent")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dev, "vport1p1"), p)

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = WaitVirtioPort(ctx, sys, dev, "never")
	assert.ErrorContains(t, err, "no virtio-serial port named")
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestSupervisorPowersOffWhenTheHostNeverComes(t *testing.T) {
	var attempts atomic.Int32
	sv := supervisor{grace: 300 * time.Millisecond, log: quiet, session: func(ctx context.Context, _ func()) error {
		attempts.Add(1)
		return errors.New("dial: no host")
	}}
	start := time.Now()
	reason := sv.run(context.Background())
	assert.Equal(t, "no host connection for 300ms", reason)
	assert.InDelta(t, 300*time.Millisecond, time.Since(start), float64(250*time.Millisecond))
	assert.Greater(t, attempts.Load(), int32(1), "it retries within the grace")
}

func TestSupervisorPowersOffOnShutdown(t *testing.T) {
	sv := supervisor{grace: time.Second, log: quiet, session: func(ctx context.Context, connected func()) error {
		connected()
		return nil
	}}
	assert.Equal(t, "the host asked the guest to stop", sv.run(context.Background()))
}

func TestSupervisorGraceRestartsWhenTheConnectionIsLostAndRecovers(t *testing.T) {
	var n atomic.Int32
	sv := supervisor{grace: 400 * time.Millisecond, log: quiet, session: func(ctx context.Context, connected func()) error {
		switch n.Add(1) {
		case 1, 2: // connected sessions that last longer than the grace, then drop
			connected()
			time.Sleep(500 * time.Millisecond)
			return errors.New("host connection lost")
		case 3: // the host stays silent: the handshake hangs
			<-ctx.Done()
			return ctx.Err()
		}
		t.Error("no attempt after the grace")
		return nil
	}}
	start := time.Now()
	reason := sv.run(context.Background())
	assert.Equal(t, "no host connection for 400ms", reason)
	assert.Equal(t, int32(3), n.Load())
	took := time.Since(start)
	assert.Greater(t, took, 1000*time.Millisecond, "connected time does not count against the grace")
	assert.Less(t, took, 2000*time.Millisecond)
}

func TestSupervisorStopsOnContextEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sv := supervisor{grace: time.Minute, log: quiet, session: func(ctx context.Context, connected func()) error {
		connected()
		cancel()
		<-ctx.Done()
		return nil
	}}
	assert.Equal(t, "stop signal", sv.run(ctx))
}
