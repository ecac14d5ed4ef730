package api

import "errors"

// Failure codes: every failed state event carries one in "code". They are
// stable: a caller branches on them, never on the message. Package
// host/failure derives them from sentinel errors with errors.Is.
const (
	// The caller's input.
	CodeInvalidBootstrap     = "invalid_bootstrap"
	CodeNoLink               = "no_link"
	CodePublicURLUnreachable = "public_url_unreachable"
	// The host's configuration or platform.
	CodeInvalidConfig       = "invalid_config"
	CodeGuestIncompatible   = "guest_incompatible"
	CodeOSUnsupported       = "os_unsupported"
	CodeProviderUnavailable = "provider_unavailable"
	CodeAppArmorMissing     = "apparmor_profile_missing"
	CodePlatformDoorOpen    = "platform_door_open"
	// The boot.
	CodeBootTimeout = "boot_timeout"
	// The workload, as the guest reports it.
	CodeDaemonUnhealthy = "daemon_unhealthy"
	CodeDaemonFailed    = "daemon_failed"
	CodeSandboxIOFailed = "sandbox_io_failed"
	CodeGuestFailed     = "guest_failed"
	// The runtime and the guest agent.
	CodeRuntimeFailed = "runtime_failed"
	CodeHostileGuest  = "hostile_guest"
	// CodeInternal is any failure no other code names: a defect to report.
	CodeInternal = "internal"
)

// Failure describes one failure code for callers: the exit status of
// oac-shim, the HTTP status (and error name) a node provider answers with,
// and what a caller should do.
type Failure struct {
	Code string
	// Exit is oac-shim's exit status when its sandbox ends with this code.
	Exit int
	// HTTPStatus and HTTPError are what a node provider maps the code to.
	HTTPStatus int
	HTTPError  string
	// Retry: the same request may succeed later, unchanged.
	Retry bool
	// Action says what a caller should do.
	Action string
}

// Exit statuses of oac-shim besides the failures' own.
const (
	ExitOK    = 0 // the sandbox stopped cleanly
	ExitUsage = 2 // the command line is wrong; nothing was started and no event written
	// ExitNotRunning: oac-shim attach found nothing to attach to (no
	// shim runs the name, or its shim runs without --outlive-parent).
	ExitNotRunning = 10
	// ExitShimDied: oac-shim attach read the journal of a shim that
	// died (killed or crashed) before its final state.
	ExitShimDied = 11
)

// Failures lists every failure code, in the order of the documentation.
// Adding a failure kind means a row here, a sentinel and a rule in package
// host/failure, and the code in schema/event.schema.json (a test checks
// all three agree).
var Failures = []Failure{
	{CodeInvalidBootstrap, 3, 400, CodeInvalidBootstrap, false,
		"Fix the bootstrap: the message names the rule that failed. Nothing was created."},
	{CodeNoLink, 3, 409, "sandbox_configuration_error", false,
		"A hosted sandbox needs a Link URL: configure a public https URL that gives one. Nothing was created."},
	{CodePublicURLUnreachable, 3, 409, "sandbox_configuration_error", false,
		"The Link URL is loopback or not TLS: configure a public https (wss) URL. Nothing was created."},
	{CodeInvalidConfig, 4, 500, CodeInvalidConfig, false,
		"The host's configuration of oac-shim is wrong (paths, forwards, control socket, password output, a name already running): fix the operator's setup."},
	{CodeGuestIncompatible, 4, 500, CodeGuestIncompatible, false,
		"The guest image's agent speaks no protocol version this oac-shim speaks (or is not an oac agent): ship the image and the shim of one release."},
	{CodeOSUnsupported, 5, 503, CodeOSUnsupported, false,
		"This OS version cannot run sandboxes (the message says which version is needed): tell the user; do not retry."},
	{CodeProviderUnavailable, 5, 503, CodeProviderUnavailable, false,
		"The provider cannot run on this host: run `oac-shim check`, install what it names, or pick another provider or node."},
	{CodeAppArmorMissing, 5, 503, CodeAppArmorMissing, false,
		"The container engine (or a Kubernetes node) confines containers with AppArmor, whose default profile refuses the mounts the guest makes for the workload, and the guest's profile oac-guest is not loaded, and oac-shim could not load it (not root, no apparmor_parser, or the parser refused it; the message says which): install examples/apparmor/oac-guest on the host or node (docs/providers.md#apparmor), or run oac-shim as root with apparmor_parser installed. Nothing was created."},
	{CodePlatformDoorOpen, 5, 503, CodePlatformDoorOpen, false,
		"The platform opened a door to the host (a Windows drive, WSL interop, a host socket or share; the message names each) that this guest cannot close for the workload: close it in the platform's configuration (WSL: the image's /etc/wsl.conf) or run where the guest can give the workload a mount namespace. Nothing of the workload ran."},
	{CodeBootTimeout, 6, 504, CodeBootTimeout, true,
		"The guest was not ready within the boot timeout: retry (the host may be loaded) or raise --boot-timeout; look at the log events."},
	{CodeDaemonUnhealthy, 7, 502, CodeDaemonUnhealthy, true,
		"The daemon started but did not answer its health check in time: look at its log events; retry once."},
	{CodeDaemonFailed, 7, 502, CodeDaemonFailed, true,
		"The daemon could not be started or exited: look at its log and process events; a start command tries again."},
	{CodeSandboxIOFailed, 7, 502, CodeSandboxIOFailed, false,
		"oac-sandbox-io could not be set up or started, or refused its arguments: check the image and the provided bootstrap file."},
	{CodeGuestFailed, 7, 502, CodeGuestFailed, true,
		"The guest agent failed on its own (the message says what): retry once, then report it with the diagnostics."},
	{CodeRuntimeFailed, 8, 502, CodeRuntimeFailed, true,
		"The runtime (bwrap, qemu, runc, ...) failed or the guest went away: retry once, then report it with oac-shim's stderr."},
	{CodeHostileGuest, 9, 502, CodeHostileGuest, false,
		"The guest broke a protocol bound and was killed: do not retry with the same image; treat it as a security event."},
	{CodeInternal, 1, 500, CodeInternal, false,
		"A failure no code names: a defect; report it with the message and oac-shim's stderr."},
}

// FailureOf returns the description of code; unknown codes get the one
// of CodeInternal.
func FailureOf(code string) Failure {
	for _, f := range Failures {
		if f.Code == code {
			return f
		}
	}
	return FailureOf(CodeInternal)
}

// Answer codes: every answer with ok false carries one in "code", as every
// failed state carries a failure code. They are stable: a caller branches
// on them, never on "error" (which is for people).
const (
	AnswerInvalidCommand  = "invalid_command"
	AnswerUnknownCommand  = "unknown_command"
	AnswerInvalidArgument = "invalid_argument"
	AnswerNotReady        = "not_ready"
	AnswerUnsupported     = "unsupported"
	AnswerStopping        = "stopping"
	AnswerConflict        = "conflict"
	AnswerNotFound        = "not_found"
	AnswerLimitReached    = "limit_reached"
	AnswerFailed          = "failed"
)

// AnswerCodeInfo describes one answer code for callers.
type AnswerCodeInfo struct {
	Code string
	// Retry: the same command may succeed later, unchanged.
	Retry bool
	// Meaning says when it is given and what a caller should do.
	Meaning string
}

// AnswerCodes lists every answer code, in the order of the documentation.
// Adding one means a row here, the code in schema/answer.schema.json, and
// the place that gives it (Decode, package apiserver, or the handler); a
// test checks the first two agree.
var AnswerCodes = []AnswerCodeInfo{
	{AnswerInvalidCommand, false,
		"The line is not a command: longer than 64 KiB, not UTF-8, not one JSON object, a key twice, trailing data, no \"cmd\", a bad \"id\". Fix the caller."},
	{AnswerUnknownCommand, false,
		"\"cmd\" names no command this oac-shim knows (an older shim than the caller?). The error lists the known ones."},
	{AnswerInvalidArgument, false,
		"The command is known but its keys or values are not: a key it does not take, a missing one, a value of the wrong type or out of range, an egress rule or a forward address refused. Nothing changed."},
	{AnswerNotReady, true,
		"The command needs a connected guest and none is (push_time before the guest connected or after it went away). Retry once the sandbox is ready."},
	{AnswerUnsupported, false,
		"This sandbox cannot do it (push_time to a guest that does not set its clock from the host: every guest but a VM; claim with volumes on a provider that cannot mount them into a running guest: every one but those sharing the host's kernel under a root shim, and the sandbox stays warm)."},
	{AnswerStopping, false,
		"The shim is stopping (a stop command, a signal, the timeout): it starts nothing and adds no forward any more."},
	{AnswerConflict, false,
		"add_forward: a forward already listens on that address. claim: the sandbox is not warm (not started with --warm, not yet warm, or claimed already); a warm sandbox is claimed once."},
	{AnswerNotFound, false,
		"remove_forward: no forward listens on that address."},
	{AnswerLimitReached, true,
		"A bound was reached: 64 forwards, or the control socket's connections. Remove one, or close a connection, and retry."},
	{AnswerFailed, true,
		"A valid command failed for a reason no other code names (a forward's address could not be bound, the guest did not take the time): the error says what."},
}

// CommandError is a refused or failed command with its answer code.
type CommandError struct {
	Code string
	Err  error
}

func (e *CommandError) Error() string { return e.Err.Error() }
func (e *CommandError) Unwrap() error { return e.Err }

// Refuse marks err with the answer code code, keeping its message.
func Refuse(code string, err error) error {
	if err == nil {
		return nil
	}
	return &CommandError{Code: code, Err: err}
}

// AnswerCode is the code of the answer to a command that ended with err:
// the code of the first CommandError in its chain, else AnswerFailed; ""
// for nil.
func AnswerCode(err error) string {
	if err == nil {
		return ""
	}
	var c *CommandError
	if errors.As(err, &c) && c.Code != "" {
		return c.Code
	}
	return AnswerFailed
}
