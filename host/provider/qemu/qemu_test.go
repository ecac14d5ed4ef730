//go:build linux

package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

// fakeProvider returns a provider whose "qemu" is a shell script.
func fakeProvider(t *testing.T, script string) *Provider {
	t.Helper()
	dir, err := os.MkdirTemp("", "oacq") // short: unix socket paths are limited
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	q := filepath.Join(dir, "qemu")
	require.NoError(t, os.WriteFile(q, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	k := filepath.Join(dir, "vmlinuz")
	i := filepath.Join(dir, "initramfs.img")
	require.NoError(t, os.WriteFile(k, []byte("k"), 0o644))
	require.NoError(t, os.WriteFile(i, []byte("i"), 0o644))
	return &Provider{Qemu: q, Kernel: k, Initramfs: i, Accel: AccelTCG, StateRoot: filepath.Join(dir, "state")}
}

func TestCreateRefusesWhatItCannotBoot(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	ctx := context.Background()
	_, err := p.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a", Rootfs: "/some/dir"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "--rootfs is a bwrap option")

	missing := *p
	missing.Initramfs = filepath.Join(t.TempDir(), "nope.img")
	_, err = missing.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a"})
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "make initramfs builds it")

	bad := *p
	bad.Accel = "fast"
	assert.ErrorIs(t, bad.Check(ctx), provider.ErrInvalidSpec)
	bad = *p
	bad.Transport = "tcp"
	assert.ErrorIs(t, bad.Check(ctx), provider.ErrInvalidSpec)
	if _, err := os.Stat(devVhostVsock); err != nil {
		bad.Transport = TransportVsock
		err := bad.Check(ctx)
		assert.ErrorIs(t, err, provider.ErrUnavailable)
		assert.ErrorContains(t, err, "/dev/vhost-vsock")
	}
	_, err = os.Stat(filepath.Join(p.StateRoot, "sandboxes", "x"))
	assert.True(t, os.IsNotExist(err), "nothing left behind")
}

func TestInstanceCapturesTheConsoleAndReportsPowerOff(t *testing.T) {
	p := fakeProvider(t, `printf 'Linux version\r\n'; echo "$@" >&2; exit 0`)
	var diag syncBuffer
	in, err := p.Create(context.Background(), provider.Spec{Name: "con", AgentPath: "/a", Stderr: &diag})
	require.NoError(t, err)
	defer in.Destroy()
	sock := filepath.Join(p.StateRoot, "sandboxes", "con", "agent.sock")
	st, err := os.Stat(sock)
	require.NoError(t, err)
	assert.NotZero(t, st.Mode()&os.ModeSocket, "the shim listens before qemu starts")

	require.NoError(t, in.Start(context.Background()))
	select {
	case <-in.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("fake qemu did not exit")
	}
	assert.EqualError(t, in.Err(), "virtual machine powered off")
	assert.Contains(t, diag.String(), "Linux version\n")
	assert.Contains(t, diag.String(), "server=off,path="+sock)
	_, err = in.Accept(context.Background())
	assert.EqualError(t, err, "virtual machine powered off", "Accept gives up when qemu is gone")

	require.NoError(t, in.Destroy())
	_, err = os.Stat(filepath.Dir(sock))
	assert.True(t, os.IsNotExist(err), "Destroy removes the state directory")
}

func TestKillStopsQemuAndTheNameIsFreeAgain(t *testing.T) {
	p := fakeProvider(t, "exec sleep 1000")
	in, err := p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	require.NoError(t, err)
	_, err = p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	assert.ErrorIs(t, err, provider.ErrExists)
	require.NoError(t, in.Start(context.Background()))
	assert.NotZero(t, in.(*Instance).HostPID())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = in.Accept(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, in.Kill())
	assert.ErrorContains(t, in.Err(), "qemu exited: signal: killed")
	require.NoError(t, in.Destroy())
	again, err := p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	require.NoError(t, err)
	require.NoError(t, again.Destroy())
}
