package transport

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRoundTripsEveryScheme(t *testing.T) {
	for raw, want := range map[string]Endpoint{
		"unix:///run/oac/agent.sock":          {Scheme: SchemeUnix, Path: "/run/oac/agent.sock"},
		"vsock://2:1024":                      {Scheme: SchemeVsock, CID: 2, Port: 1024},
		"vsock://4294967295:1/":               {Scheme: SchemeVsock, CID: 4294967295, Port: 1},
		"stdio://":                            {Scheme: SchemeStdio},
		"serial:///dev/vport0p1":              {Scheme: SchemeSerial, Path: "/dev/vport0p1"},
		"unix+listen:///run/oac/session.sock": {Scheme: SchemeUnixListen, Path: "/run/oac/session.sock"},
	} {
		got, err := Parse(raw)
		require.NoError(t, err, raw)
		assert.Equal(t, want, got, raw)
		again, err := Parse(got.String())
		require.NoError(t, err)
		assert.Equal(t, got, again, "String() parses back")
	}
}

func TestParseRefusesMalformedVsockAndOtherEndpoints(t *testing.T) {
	for _, raw := range []string{
		"vsock://2", "vsock://:1024", "vsock://2:", "vsock://x:1024", "vsock://2:1024/path",
		"vsock://2:99999999999", "vsock://-1:5", "vsock://u@2:5", "vsock://2:5?q=1",
		"unix://relative", "unix:///a/../b", "serial://dev/x", "stdio://host", "tcp://1.2.3.4:5",
	} {
		_, err := Parse(raw)
		assert.Error(t, err, raw)
	}
}

func TestSerialDialAcceptsOnlyCharacterDevices(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("serial ports are a Linux guest feature")
	}
	f := filepath.Join(t.TempDir(), "port")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err := Endpoint{Scheme: SchemeSerial, Path: f}.Dial(context.Background())
	assert.ErrorContains(t, err, "not a character device")
	_, err = Endpoint{Scheme: SchemeSerial, Path: "/nonexistent/vport9p9"}.Dial(context.Background())
	assert.ErrorContains(t, err, "open serial port /nonexistent/vport9p9")
	c, err := Endpoint{Scheme: SchemeSerial, Path: os.DevNull}.Dial(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "serial:"+os.DevNull, c.RemoteAddr().String())
	require.NoError(t, c.Close())
}

// The vsock tests never dial CID 2: on a machine that is itself a VM, that
// is the real hypervisor. CID 1 is local loopback: refused, timed out or
// unsupported depending on the kernel, an error in every case.
func TestVsockDialErrorsSayWhatToCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Endpoint{Scheme: SchemeVsock, CID: 1, Port: 47999}.Dial(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dial vsock://1:47999")
}

func TestVsockDialGivesUpWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Endpoint{Scheme: SchemeVsock, CID: 1, Port: 47998}.Dial(ctx)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Contains(t, err.Error(), "dial vsock://1:47998")
}
