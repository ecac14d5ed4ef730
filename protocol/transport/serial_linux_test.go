package transport_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/transport"
)

func serial(path string) transport.Endpoint {
	return transport.Endpoint{Scheme: transport.SchemeSerial, Path: path}
}

func TestSerialDialRefusesARegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-a-port")
	require.NoError(t, os.WriteFile(path, []byte("keep"), 0o600))

	c, err := serial(path).Dial(context.Background())

	assert.Nil(t, c)
	require.Error(t, err)
	assert.EqualError(t, err, "open serial port "+path+": not a character device")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(data), "the file must be left as it was")
}

func TestSerialDialRefusesADirectory(t *testing.T) {
	_, err := serial(t.TempDir()).Dial(context.Background())

	require.Error(t, err)
	assert.Contains(t, err.Error(), "open serial port")
}

func TestSerialDialOfAMissingDeviceNamesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vport9p9")

	_, err := serial(path).Dial(context.Background())

	require.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), "open serial port "+path)
}

func TestSerialDialOpensACharacterDevice(t *testing.T) {
	c, err := serial("/dev/null").Dial(context.Background())
	require.NoError(t, err)

	assert.Equal(t, "serial:/dev/null", c.LocalAddr().String())
	n, err := c.Write([]byte("frame"))
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
	assert.NoError(t, c.SetDeadline(time.Now().Add(time.Second)), "devices without deadline support ignore them")
	require.NoError(t, c.Close())
	assert.NoError(t, c.Close(), "the device is closed once even though it is both ends")
}
