package shimcli

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/ospolicy"
)

func withOS(t *testing.T, o ospolicy.OS) {
	t.Helper()
	old := detectOS
	detectOS = func() ospolicy.OS { return o }
	t.Cleanup(func() { detectOS = old })
}

func TestCheckJSONReportsPolicyAndEveryProvider(t *testing.T) {
	withOS(t, ospolicy.OS{GOOS: "windows", Version: "10.0", Build: 19045, Name: "Windows 10 (build 19045)"})
	var out, errOut bytes.Buffer
	Main([]string{"check", "--json"}, nil, &out, &errOut)
	var r CheckReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	assert.Equal(t, ospolicy.Warn, r.Policy.Level, "Windows 10 22H2 warns")
	assert.Contains(t, r.Policy.Message, "Windows 10 22H2")
	var names []string
	honours := map[string][]string{}
	for _, p := range r.Providers {
		names = append(names, p.Name)
		honours[p.Name] = p.Honours
		if !p.Available {
			assert.NotEmpty(t, p.Reason, p.Name)
			assert.Empty(t, p.Workload, p.Name)
			continue
		}
		// Every provider says how the workload is confined and limited.
		assert.Contains(t, p.Workload, "seccomp filter", p.Name)
		assert.Contains(t, p.Workload, "limits: ", p.Name)
	}
	assert.Equal(t, []string{"bwrap", "docker", "kubernetes", "oci", "qemu", "vz", "wsl"}, names)
	// What run refuses, before anything is created, is in the report,
	// for every provider (an empty list when it honours none).
	assert.Equal(t, len(r.Providers), strings.Count(out.String(), `"honours": [`))
	if runtime.GOOS != "linux" {
		return
	}
	assert.Equal(t, []string{"--sandbox-io", "--install", "--volume"}, honours["qemu"])
	assert.Equal(t, []string{"--rootfs", "--sandbox-io", "--install", "--volume"}, honours["oci"])
	assert.Equal(t, []string{"--sandbox-io", "--install", "--volume"}, honours["docker"])
	assert.Equal(t, []string{"--rootfs"}, honours["wsl"])
}

func TestCheckTextAndABlockedOS(t *testing.T) {
	withOS(t, ospolicy.OS{GOOS: "darwin", Version: "11.7.10", Name: "macOS 11.7.10"})
	var out, errOut bytes.Buffer
	code := Main([]string{"check"}, nil, &out, &errOut)
	assert.Equal(t, 1, code, "a blocked OS fails check")
	assert.Contains(t, out.String(), "os: macOS 11.7.10\npolicy: block: macOS 11.7.10 is not supported")
	assert.Contains(t, out.String(), "\nvz: unavailable: macOS 11.7.10 is not supported", "no provider runs on a blocked OS")

	out.Reset()
	code = Main([]string{"run", "--provider", "bwrap", "--name", "x", "--agent", "/nonexistent"}, nil, &out, &errOut)
	assert.Equal(t, api.FailureOf(api.CodeOSUnsupported).Exit, code)
	assert.Contains(t, errOut.String(), "oac-shim: macOS 11.7.10 is not supported")
	var e api.Event
	require.NoError(t, json.Unmarshal(out.Bytes(), &e), "one failed event: %s", out.String())
	assert.Equal(t, api.StateFailed, e.State)
	assert.Equal(t, api.CodeOSUnsupported, e.Code)
}

func TestUnknownProviderIsAUsageError(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, Main([]string{"run", "--provider", "nope", "--name", "x"}, nil, &out, &errOut))
	assert.Contains(t, errOut.String(), "have bwrap, docker, kubernetes, oci, qemu, vz, wsl")
}
