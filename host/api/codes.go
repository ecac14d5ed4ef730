package api

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
