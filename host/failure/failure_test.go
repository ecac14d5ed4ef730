package failure

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/events"
	"github.com/oac/sandbox-agent/host/provider"
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
		{"no link", invalid(bootstrap.ErrNoLink), events.CodeNoLink},
		{"loopback link", invalid(bootstrap.ErrPublicURLUnreachable), events.CodePublicURLUnreachable},
		{"another tenant", invalid(bootstrap.ErrWrongTenant), events.CodeInvalidBootstrap},
		{"a daemon rule", invalid(fmt.Errorf("daemon: %w", bootstrap.ErrArgv)), events.CodeInvalidBootstrap},
		{"malformed JSON", invalid(fmt.Errorf("%w: syntax error at byte 3", bootstrap.ErrDecode)), events.CodeInvalidBootstrap},
		{"identity flags disagree", bootstrap.ErrIdentityMismatch, events.CodeInvalidBootstrap},
		{"the guest refused it", With(ErrGuestBootstrap, errors.New("guest: bootstrap refused")), events.CodeInvalidBootstrap},
		{"provider missing", With(ErrRuntimeFailed, fmt.Errorf("create bwrap sandbox: %w: bwrap not found", provider.ErrUnavailable)), events.CodeProviderUnavailable},
		{"bad spec", fmt.Errorf("nothing created: %w: no oac-guest binary given", provider.ErrInvalidSpec), events.CodeInvalidConfig},
		{"name in use", With(ErrRuntimeFailed, fmt.Errorf("create: %w", provider.ErrExists)), events.CodeInvalidConfig},
		{"forward in use", With(ErrInvalidConfig, errors.New("nothing created: listen 127.0.0.1:80: address in use")), events.CodeInvalidConfig},
		{"old macOS", With(ErrOSUnsupported, errors.New("macOS 11 is not supported")), events.CodeOSUnsupported},
		{"version mismatch", With(ErrRuntimeFailed, fmt.Errorf("handshake with guest: %w: guest speaks 2..3, host 1..1", protocol.ErrVersionMismatch)), events.CodeGuestIncompatible},
		{"not a session", With(ErrRuntimeFailed, fmt.Errorf("guest sent bytes that are not an oac session: %w", yamux.ErrInvalidVersion)), events.CodeGuestIncompatible},
		{"not ready in time", With(ErrBootTimeout, errors.New("guest not ready within 30s")), events.CodeBootTimeout},
		{"health deadline", With(GuestReason(protocol.ReasonDaemonUnhealthy), errors.New("guest: daemon not healthy within 30s")), events.CodeDaemonUnhealthy},
		{"daemon exited", With(GuestReason(protocol.ReasonDaemonFailed), errors.New("guest: daemon exited: exit status 3")), events.CodeDaemonFailed},
		{"sandbox-io usage", With(GuestReason(protocol.ReasonSandboxIO), errors.New("guest: oac-sandbox-io exit status 2")), events.CodeSandboxIOFailed},
		{"guest's own", With(GuestReason(protocol.ReasonGuest), errors.New("guest: sethostname: EPERM")), events.CodeGuestFailed},
		{"an older guest names no reason", With(GuestReason(""), errors.New("guest: something")), events.CodeGuestFailed},
		{"a guest names a reason it may not", With(GuestReason("hostile_guest"), errors.New("guest: x")), events.CodeGuestFailed},
		{"runtime exited", With(ErrRuntimeFailed, errors.New("exit status 1")), events.CodeRuntimeFailed},
		{"connection cut mid-frame", fmt.Errorf("guest broke the protocol on the control stream: %w", protocol.ErrTruncated), events.CodeRuntimeFailed},
		{"bound exceeded", fmt.Errorf("%w: 600 streams open", ErrHostileGuest), events.CodeHostileGuest},
		{"oversized frame, even when marked otherwise", With(ErrRuntimeFailed, fmt.Errorf("control stream: %w", protocol.ErrFrameTooLarge)), events.CodeHostileGuest},
		{"bad State body", fmt.Errorf("guest sent a bad State: %w", protocol.ErrBadBody), events.CodeHostileGuest},
		{"unknown", io.ErrShortWrite, events.CodeInternal},
		{"known only by its code", WithCode(events.CodeBootTimeout, errors.New("guest not ready within 30s")), events.CodeBootTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.code, Code(tc.err))
			assert.Equal(t, events.FailureOf(tc.code).Exit, Exit(tc.err))
		})
	}
	assert.Equal(t, "", Code(nil))
	assert.Equal(t, events.ExitOK, Exit(nil))
}

func TestAMessageAloneGivesNoCode(t *testing.T) {
	assert.Equal(t, events.CodeInternal, Code(errors.New(bootstrap.ErrNoLink.Error())),
		"text that reads like a known failure is still unknown")
}

func TestEveryCodeHasARuleAndEveryRuleADocumentedCode(t *testing.T) {
	documented := map[string]bool{}
	for _, f := range events.Failures {
		assert.False(t, documented[f.Code], "code %s listed twice", f.Code)
		documented[f.Code] = true
	}
	ruled := map[string]bool{}
	for _, r := range rules {
		assert.True(t, documented[r.code], "rule code %s is not in events.Failures", r.code)
		ruled[r.code] = true
	}
	for _, f := range events.Failures {
		if f.Code != events.CodeInternal {
			assert.True(t, ruled[f.Code], "code %s has no rule", f.Code)
		}
	}
}

func TestExitStatusesAreDistinctPerClass(t *testing.T) {
	for _, f := range events.Failures {
		assert.NotContains(t, []int{events.ExitOK, events.ExitUsage}, f.Exit, f.Code)
		assert.True(t, f.Exit > 0 && f.Exit < 64, f.Code)
		assert.NotEmpty(t, f.Action, f.Code)
		assert.GreaterOrEqual(t, f.HTTPStatus, 400, f.Code)
		assert.NotEmpty(t, f.HTTPError, f.Code)
	}
	// The two Link codes are the node provider's 409 configuration error.
	for _, c := range []string{events.CodeNoLink, events.CodePublicURLUnreachable} {
		assert.Equal(t, 409, events.FailureOf(c).HTTPStatus)
		assert.Equal(t, "sandbox_configuration_error", events.FailureOf(c).HTTPError)
	}
	assert.Equal(t, events.CodeInternal, events.FailureOf("no such code").Code)
}

// docs/schema.md lists every code with the exit status, HTTP status, retry
// and action of events.Failures, in the same order.
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
	for _, f := range events.Failures {
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
