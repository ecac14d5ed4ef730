package transport_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/transport"
)

func hasVsockDevice() bool {
	_, err := os.Stat("/dev/vsock")
	return err == nil
}

// testVsockPort is a high port nothing else here is expected to use.
var testVsockPort = uint32(0x7a5c0000 + os.Getpid()%0xffff)

func TestVsockDialWithADoneContextFailsWithoutDialing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	start := time.Now()
	c, err := transport.Endpoint{Scheme: transport.SchemeVsock, CID: 2, Port: testVsockPort}.Dial(ctx)

	assert.Nil(t, c)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), fmt.Sprintf("dial vsock://2:%d", testVsockPort))
	assert.Less(t, time.Since(start), time.Second)
}

func TestVsockDialWithoutADeviceSaysWhatToCheck(t *testing.T) {
	if hasVsockDevice() {
		// Dialing here would send a connection request to the hypervisor.
		t.Skip("this machine has /dev/vsock; the no-device error path cannot be reached without dialing the host")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	c, err := transport.Endpoint{Scheme: transport.SchemeVsock, CID: 2, Port: testVsockPort}.Dial(ctx)

	assert.Nil(t, c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is the vsock device present?")
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
}
