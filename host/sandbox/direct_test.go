package sandbox

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/protocol"
)

// unprivilegedRoot is a provider whose guest root has no capability in
// the host's user namespace.
type unprivilegedRoot struct{ *fakeProvider }

func (unprivilegedRoot) Capabilities() provider.Capabilities {
	return provider.Capabilities{GuestRootUnprivileged: true}
}

func TestDirectModeIsOfferedOnlyWhereEveryGuaranteeHolds(t *testing.T) {
	fd := []string{protocol.CapDataFD, protocol.CapDataHand}
	hello := protocol.Hello{Capabilities: []string{protocol.CapDataFD, protocol.CapDataHand, protocol.CapDataDirect}}

	for plane, wants := range map[string]bool{"": true, DataPlaneDirect: true, protocol.CapDataFD: false, protocol.CapDataDial: false, DataPlaneOff: false} {
		s := &run{cfg: Config{DataPlane: plane}}
		assert.Equal(t, wants, s.wantsDirect(), "--data-plane %q: direct mode is the default, named or not; a carrier asked for by name is that carrier", plane)
	}

	s := &run{cfg: Config{Provider: unprivilegedRoot{&fakeProvider{}}, DataPlane: DataPlaneDirect}}
	g, why := s.openDirect([]string{protocol.CapDataDial})
	assert.Nil(t, g)
	assert.Equal(t, "direct mode unavailable: it needs the fd channel (a guest sharing this kernel on a unix transport, and oac-shim as root); connections take the data connection path", why)

	s = &run{cfg: Config{Provider: &fakeProvider{}, DataPlane: DataPlaneDirect}}
	g, why = s.openDirect(fd)
	assert.Nil(t, g, "a guest root with the host's capabilities is never handed a host socket")
	assert.Contains(t, why, "the fake provider's guest root holds capabilities in the host's user namespace")

	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: the guard needs root")
		}
		t.Skip("the guard needs root")
	}
	s = &run{cfg: Config{Provider: unprivilegedRoot{&fakeProvider{}}, DataPlane: DataPlaneDirect}}
	s.direct, s.directOff = s.openDirect(fd)
	require.NotNil(t, s.direct, s.directOff)
	defer s.closeDirect()
	lo, hi := s.direct.Share()
	assert.Less(t, lo, hi)
	assert.Regexp(t, `^direct mode offered: host ports \d+-\d+ are this sandbox's share`, s.directSaid(hello))
	assert.Equal(t, "direct mode unavailable: this guest's agent cannot trap connects; connections take the handed path",
		s.directSaid(protocol.Hello{Capabilities: fd}))
	assert.Nil(t, s.direct, "a guest that cannot take direct mode gives its port share back at once")
}
