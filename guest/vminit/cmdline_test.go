//go:build linux

package vminit

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/initramfs"
	"github.com/oac/sandbox-agent/protocol/transport"
	"github.com/oac/sandbox-agent/protocol/vmparams"
)

func TestParseCmdlineSplitsLikeTheKernel(t *testing.T) {
	kv, err := ParseCmdline(`console=ttyS0 quiet oac.transport=serial:oac.agent foo="a b c" x=1 x=2 -- init args oac.debug=1` + "\n")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{
		"console": "ttyS0", "quiet": "", "oac.transport": "serial:oac.agent", "foo": "a b c", "x": "2",
	}, kv, "quotes removed, last value wins, nothing after --")
	_, err = ParseCmdline(`a="unterminated`)
	assert.ErrorContains(t, err, "unterminated")
	_, err = ParseCmdline(strings.Repeat("a", MaxCmdline+1))
	assert.Error(t, err)
}

func TestParseParams(t *testing.T) {
	p, err := ParseParams("console=ttyS0 oac.transport=serial:oac.agent oac.host_grace=5s oac.debug=1\n")
	require.NoError(t, err)
	assert.Equal(t, Params{Transport: Transport{SerialName: "oac.agent"}, HostGrace: 5 * time.Second, Debug: true}, p)

	p, err = ParseParams("oac.transport=vsock:1024")
	require.NoError(t, err)
	assert.Equal(t, &transport.Endpoint{Scheme: transport.SchemeVsock, CID: 2, Port: 1024}, p.Transport.Vsock, "the host is CID 2")
	assert.Equal(t, DefaultHostGrace, p.HostGrace)
	assert.Equal(t, "vsock:2:1024", p.Transport.String())

	p, err = ParseParams("oac.transport=vsock:3:5000")
	require.NoError(t, err)
	assert.Equal(t, uint32(3), p.Transport.Vsock.CID)

	_, err = ParseParams("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet")
	assert.ErrorIs(t, err, ErrNotVM)

	for _, bad := range []string{
		"oac.transport=serial:", "oac.transport=serial:a/b", "oac.transport=serial:../x",
		"oac.transport=vsock:", "oac.transport=vsock:x", "oac.transport=vsock:1:2:3", "oac.transport=vsock:99999999999",
		"oac.transport=tcp:1", "oac.transport=serial:a oac.host_grace=1ms", "oac.transport=serial:a oac.host_grace=2h",
		"oac.transport=serial:a oac.host_grace=soon",
	} {
		_, err := ParseParams(bad)
		assert.Error(t, err, bad)
		assert.NotErrorIs(t, err, ErrNotVM, bad)
	}
}

func TestModuleListPathMatchesTheImageBuilder(t *testing.T) {
	assert.Equal(t, initramfs.ModuleListPath, ModuleListPath)
}

// FuzzParseParams: the kernel command line is input the guest did not
// write; parsing never panics and whatever parses is well-formed.
func FuzzParseParams(f *testing.F) {
	f.Add("console=ttyS0 panic=-1 quiet oac.transport=serial:oac.agent oac.host_grace=30s\n")
	f.Add(`oac.transport=vsock:2:1024 a="b c" -- x`)
	f.Add(`oac.transport="serial:x" "`)
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseParams(s)
		if err != nil {
			return
		}
		if p.HostGrace < MinHostGrace || p.HostGrace > MaxHostGrace {
			t.Fatalf("grace out of bounds: %s", p.HostGrace)
		}
		if p.Transport.Vsock == nil && !portNameRE().MatchString(p.Transport.SerialName) {
			t.Fatalf("bad serial name accepted: %q", p.Transport.SerialName)
		}
		if strings.ContainsAny(p.Transport.SerialName, "/\x00") {
			t.Fatalf("port name could name a path: %q", p.Transport.SerialName)
		}
	})
}

func TestParseParamsRootAndShares(t *testing.T) {
	p, err := ParseParams("oac.transport=serial:oac.agent oac.root=vda oac.shares=workspace:/environment/workspace,home:/home")
	require.NoError(t, err)
	assert.Equal(t, "vda", p.Root)
	assert.Equal(t, []vmparams.Share{{Tag: "workspace", Path: "/environment/workspace"}, {Tag: "home", Path: "/home"}}, p.Shares)
	assert.Empty(t, p.Keep, "a throwaway sandbox keeps nothing")
	p, err = ParseParams("oac.transport=serial:oac.agent oac.root=vda oac.keep=vdb")
	require.NoError(t, err)
	assert.Equal(t, "vdb", p.Keep)
	p, err = ParseParams("oac.transport=serial:oac.agent oac.keep=vda")
	require.NoError(t, err)
	assert.Equal(t, Params{Transport: p.Transport, HostGrace: DefaultHostGrace, Keep: "vda"}, p, "a kept disk without a root disk")
	for _, bad := range []string{
		"oac.transport=serial:a oac.root=/dev/vda", "oac.transport=serial:a oac.root=",
		"oac.transport=serial:a oac.shares=w:/proc", "oac.transport=serial:a oac.shares=w",
		"oac.transport=serial:a oac.keep=/dev/vdb", "oac.transport=serial:a oac.root=vda oac.keep=vda",
	} {
		_, err := ParseParams(bad)
		assert.Error(t, err, bad)
	}
}
