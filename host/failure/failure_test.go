package failure

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

func TestCodesComeFromSentinelsNotMessages(t *testing.T) {
	invalid := func(err error) error { return fmt.Errorf("invalid bootstrap, nothing created: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		code string
	}{
		{"no link", invalid(bootstrap.ErrNoLink), api.CodeNoLink},
		{"loopback link", invalid(bootstrap.ErrPublicURLUnreachable), api.CodePublicURLUnreachable},
		{"another tenant", invalid(bootstrap.ErrWrongTenant), api.CodeInvalidBootstrap},
		{"a daemon rule", invalid(fmt.Errorf("daemon: %w", bootstrap.ErrArgv)), api.CodeInvalidBootstrap},
		{"malformed JSON", invalid(fmt.Errorf("%w: syntax error at byte 3", bootstrap.ErrDecode)), api.CodeInvalidBootstrap},
		{"identity flags disagree", bootstrap.ErrIdentityMismatch, api.CodeInvalidBootstrap},
		{"the guest refused it", With(ErrGuestBootstrap, errors.New("guest: bootstrap refused")), api.CodeInvalidBootstrap},
		{"provider missing", With(ErrRuntimeFailed, fmt.Errorf("create bwrap sandbox: %w: bwrap not found", provider.ErrUnavailable)), api.CodeProviderUnavailable},
		{"AppArmor profile missing", With(ErrRuntimeFailed, fmt.Errorf("create docker sandbox: docker: %w: the profile oac-guest is not loaded", apparmor.ErrProfileMissing)), api.CodeAppArmorMissing},
		{"AppArmor profile missing, said unavailable too", fmt.Errorf("%w: %w: a node lacks the profile", provider.ErrUnavailable, apparmor.ErrProfileMissing), api.CodeAppArmorMissing},
		{"bad spec", fmt.Errorf("nothing created: %w: no oac-guest binary given", provider.ErrInvalidSpec), api.CodeInvalidConfig},
		{"name in use", With(ErrRuntimeFailed, fmt.Errorf("create: %w", provider.ErrExists)), api.CodeInvalidConfig},
		{"forward in use", With(ErrInvalidConfig, errors.New("nothing created: listen 127.0.0.1:80: address in use")), api.CodeInvalidConfig},
		{"old macOS", With(ErrOSUnsupported, errors.New("macOS 11 is not supported")), api.CodeOSUnsupported},
		{"version mismatch", With(ErrRuntimeFailed, fmt.Errorf("handshake with guest: %w: guest speaks 2..3, host 1..1", protocol.ErrVersionMismatch)), api.CodeGuestIncompatible},
		{"not a session", With(ErrRuntimeFailed, fmt.Errorf("guest sent bytes that are not an oac session: %w", yamux.ErrInvalidVersion)), api.CodeGuestIncompatible},
		{"not ready in time", With(ErrBootTimeout, errors.New("guest not ready within 30s")), api.CodeBootTimeout},
		{"health deadline", With(GuestReason(protocol.ReasonDaemonUnhealthy), errors.New("guest: daemon not healthy within 30s")), api.CodeDaemonUnhealthy},
		{"daemon exited", With(GuestReason(protocol.ReasonDaemonFailed), errors.New("guest: daemon exited: exit status 3")), api.CodeDaemonFailed},
		{"sandbox-io usage", With(GuestReason(protocol.ReasonSandboxIO), errors.New("guest: oac-sandbox-io exit status 2")), api.CodeSandboxIOFailed},
		{"platform door", With(GuestReason(protocol.ReasonPlatformDoor), errors.New("guest: the platform opened doors to the host that this guest cannot close")), api.CodePlatformDoorOpen},
		{"guest's own", With(GuestReason(protocol.ReasonGuest), errors.New("guest: sethostname: EPERM")), api.CodeGuestFailed},
		{"an older guest names no reason", With(GuestReason(""), errors.New("guest: something")), api.CodeGuestFailed},
		{"a guest names a reason it may not", With(GuestReason("hostile_guest"), errors.New("guest: x")), api.CodeGuestFailed},
		{"runtime exited", With(ErrRuntimeFailed, errors.New("exit status 1")), api.CodeRuntimeFailed},
		{"connection cut mid-frame", fmt.Errorf("guest broke the protocol on the control stream: %w", protocol.ErrTruncated), api.CodeRuntimeFailed},
		{"bound exceeded", fmt.Errorf("%w: 600 streams open", ErrHostileGuest), api.CodeHostileGuest},
		{"oversized frame, even when marked otherwise", With(ErrRuntimeFailed, fmt.Errorf("control stream: %w", protocol.ErrFrameTooLarge)), api.CodeHostileGuest},
		{"bad State body", fmt.Errorf("guest sent a bad State: %w", protocol.ErrBadBody), api.CodeHostileGuest},
		{"unknown", io.ErrShortWrite, api.CodeInternal},
		{"known only by its code", WithCode(api.CodeBootTimeout, errors.New("guest not ready within 30s")), api.CodeBootTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.code, Code(tc.err))
			assert.Equal(t, api.FailureOf(tc.code).Exit, Exit(tc.err))
		})
	}
	assert.Equal(t, "", Code(nil))
	assert.Equal(t, api.ExitOK, Exit(nil))
}

func TestAMessageAloneGivesNoCode(t *testing.T) {
	assert.Equal(t, api.CodeInternal, Code(errors.New(bootstrap.ErrNoLink.Error())),
		"text that reads like a known failure is still unknown")
}

func TestEveryCodeHasARuleAndEveryRuleADocumentedCode(t *testing.T) {
	documented := map[string]bool{}
	for _, f := range api.Failures {
		assert.False(t, documented[f.Code], "code %s listed twice", f.Code)
		documented[f.Code] = true
	}
	ruled := map[string]bool{}
	for _, r := range rules {
		assert.True(t, documented[r.code], "rule code %s is not in api.Failures", r.code)
		ruled[r.code] = true
	}
	for _, f := range api.Failures {
		if f.Code != api.CodeInternal {
			assert.True(t, ruled[f.Code], "code %s has no rule", f.Code)
		}
	}
}

func TestExitStatusesAreDistinctPerClass(t *testing.T) {
	for _, f := range api.Failures {
		assert.NotContains(t, []int{api.ExitOK, api.ExitUsage}, f.Exit, f.Code)
		assert.True(t, f.Exit > 0 && f.Exit < 64, f.Code)
		assert.NotEmpty(t, f.Action, f.Code)
		assert.GreaterOrEqual(t, f.HTTPStatus, 400, f.Code)
		assert.NotEmpty(t, f.HTTPError, f.Code)
	}
	// The two Link codes are the node provider's 409 configuration error.
	for _, c := range []string{api.CodeNoLink, api.CodePublicURLUnreachable} {
		assert.Equal(t, 409, api.FailureOf(c).HTTPStatus)
		assert.Equal(t, "sandbox_configuration_error", api.FailureOf(c).HTTPError)
	}
	assert.Equal(t, api.CodeInternal, api.FailureOf("no such code").Code)
}

// docs/schema.md lists every code with the exit status, HTTP status, retry
// and action of api.Failures, in the same order.
func TestTheDocsListEveryCodeAsTheCodeDoes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/schema.md")
	require.NoError(t, err)
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `") && strings.Count(l, "|") == 6 {
			rows = append(rows, l)
		}
	}
	var want []string
	for _, f := range api.Failures {
		retry := "no"
		if f.Retry {
			retry = "yes"
		}
		action := f.Action
		action = strings.ReplaceAll(action, "--boot-timeout", "`--boot-timeout`")
		action = strings.ReplaceAll(action, "a start command", "a `start` command")
		want = append(want, fmt.Sprintf("| `%s` | %d | %d | %s | %s |", f.Code, f.Exit, f.HTTPStatus, retry, action))
	}
	require.Len(t, rows, len(want), "one row per code")
	for i, r := range rows {
		assert.Equal(t, want[i], r, "row %d", i)
	}
}
