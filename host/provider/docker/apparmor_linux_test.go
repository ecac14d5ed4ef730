package docker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/provider"
)

// Security options as `docker info --format '{{json .SecurityOptions}}'`
// prints them: an Ubuntu or Debian engine with AppArmor, and one without.
const (
	withAppArmor    = `["name=apparmor","name=seccomp,profile=builtin","name=cgroupns"]`
	withoutAppArmor = `["name=seccomp,profile=builtin","name=cgroupns"]`
)

// fakeHost is a docker client that answers as an engine with the given
// security options, has the image and no container, and logs each
// command line; an AppArmor securityfs with the given profiles loaded;
// and an apparmor_parser that logs its arguments and input and, unless
// told to refuse, adds the profile to the kernel's list.
type fakeHost struct {
	docker, dockerLog string
	fs, parser        string
	parserLog, input  string
	state             string
}

func newFakeHost(t *testing.T, security string, loaded ...string) *fakeHost {
	t.Helper()
	dir := t.TempDir()
	h := &fakeHost{docker: filepath.Join(dir, "docker"), dockerLog: filepath.Join(dir, "docker.log"),
		fs: filepath.Join(dir, "apparmor"), parser: filepath.Join(dir, "apparmor_parser"),
		parserLog: filepath.Join(dir, "parser.log"), input: filepath.Join(dir, "parser.in")}
	require.NoError(t, os.WriteFile(h.docker, []byte(`#!/bin/sh
echo "$*" >> `+h.dockerLog+`
case "$1" in
version) echo 27.5.1 ;;
info) echo '`+security+`' ;;
image) echo sha256:0123456789abcdef0123456789abcdef ;;
container|rm) echo "Error response from daemon: No such container: oac-box" >&2; exit 1 ;;
*) echo "fake docker: unexpected $*" >&2; exit 3 ;;
esac
`), 0o755))
	require.NoError(t, os.MkdirAll(h.fs, 0o755))
	var profiles string
	for _, p := range append([]string{"docker-default"}, loaded...) {
		profiles += p + " (enforce)\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(h.fs, "profiles"), []byte(profiles), 0o644))
	h.setParser(t, "")
	// A short state root: the sandbox's socket path must fit sun_path.
	state, err := os.MkdirTemp("", "oac-aa")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	h.state = state
	return h
}

// setParser makes the fake parser refuse with refusal on stderr, or
// (refusal "") load what it reads.
func (h *fakeHost) setParser(t *testing.T, refusal string) {
	t.Helper()
	load := `case "$1" in *r*) echo "oac-guest (enforce)" >> ` + filepath.Join(h.fs, "profiles") + ` ;; esac`
	if refusal != "" {
		load = `echo "` + refusal + `" >&2; exit 1`
	}
	require.NoError(t, os.WriteFile(h.parser, []byte(`#!/bin/sh
echo "$*" >> `+h.parserLog+`
cat > `+h.input+`
`+load+`
`), 0o755))
}

func (h *fakeHost) provider(mode string, root bool) *Provider {
	return &Provider{Docker: h.docker, Image: "oac/guest:1", AppArmor: mode, StateRoot: h.state,
		aa: apparmor.Host{Parser: h.parser, FS: h.fs, Root: func() bool { return root }}}
}

func (h *fakeHost) commands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(h.dockerLog)
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func (h *fakeHost) parserRuns(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(h.parserLog)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// nothingCreated asserts the engine was only asked questions and the
// state root holds no sandbox.
func (h *fakeHost) nothingCreated(t *testing.T) {
	t.Helper()
	for _, c := range h.commands(t) {
		verb := strings.Fields(c)[0]
		assert.Contains(t, []string{"version", "image", "info"}, verb, "only questions before the refusal: %s", c)
	}
	ents, err := os.ReadDir(h.state)
	require.NoError(t, err)
	assert.Empty(t, ents, "no state claimed")
}

func testSpec(t *testing.T) provider.Spec {
	t.Helper()
	agent := filepath.Join(t.TempDir(), "oac-guest")
	require.NoError(t, os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755))
	return provider.Spec{Name: "box", AgentPath: agent}
}

func created(t *testing.T, in provider.Instance) *Instance {
	t.Helper()
	t.Cleanup(func() { _ = in.(*Instance).Destroy() })
	return in.(*Instance)
}

func TestRequireRefusesWithoutTheProfileBeforeCreatingAnything(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	_, err := h.provider("require", true).Create(context.Background(), testSpec(t))
	require.Error(t, err)
	assert.ErrorIs(t, err, apparmor.ErrProfileMissing)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	for _, s := range []string{"the profile oac-guest is not loaded (--docker-apparmor require)", "install examples/apparmor/oac-guest",
		"apparmor_parser -r /etc/apparmor.d/oac-guest", "--docker-apparmor load"} {
		assert.Contains(t, err.Error(), s)
	}
	h.nothingCreated(t)
	assert.Empty(t, h.parserRuns(t), "require never loads")
}

func TestRequireRunsTheContainerUnderTheLoadedProfile(t *testing.T) {
	h := newFakeHost(t, withAppArmor, apparmor.Name)
	in, err := h.provider("require", false).Create(context.Background(), testSpec(t))
	require.NoError(t, err)
	args := strings.Join(created(t, in).Args(), " ")
	assert.Contains(t, args, "--security-opt apparmor=oac-guest")
	assert.Empty(t, h.parserRuns(t), "require never loads")
}

func TestLoadLoadsTheProfileAsRootThenRunsTheContainerUnderIt(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	in, err := h.provider("load", true).Create(context.Background(), testSpec(t))
	require.NoError(t, err)
	assert.Equal(t, []string{"-Kr"}, h.parserRuns(t), "one load: replace, no cache")
	got, err := os.ReadFile(h.input)
	require.NoError(t, err)
	assert.Equal(t, string(apparmor.Profile(apparmor.HostIncludes())), string(got), "the embedded profile, with this host's includes")
	args := created(t, in).Args()
	assert.Contains(t, strings.Join(args, " "), "--security-opt no-new-privileges --security-opt seccomp=")
	assert.Equal(t, 1, strings.Count(strings.Join(args, " "), "apparmor="))
	assert.Contains(t, args, "apparmor=oac-guest")
}

func TestTheDefaultModeIsLoad(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	in, err := h.provider("", true).Create(context.Background(), testSpec(t))
	require.NoError(t, err)
	created(t, in)
	assert.Equal(t, []string{"-Kr"}, h.parserRuns(t))
}

func TestLoadRefusesAProfileTheParserRejectsBeforeCreatingAnything(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	h.setParser(t, "AppArmor parser error for /dev/stdin in profile /etc/apparmor.d/tunables/global at line 3: syntax error")
	_, err := h.provider("load", true).Create(context.Background(), testSpec(t))
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "the profile oac-guest could not be loaded")
	assert.Contains(t, err.Error(), "syntax error", "the parser's own words")
	assert.Contains(t, err.Error(), "--docker-apparmor require", "names the fix")
	h.nothingCreated(t)
}

func TestLoadRefusesWhenTheKernelDoesNotListTheLoadedProfile(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	// A parser that says yes and loads nothing: an engine that reports
	// AppArmor on a kernel that cannot take the profile.
	require.NoError(t, os.WriteFile(h.parser, []byte("#!/bin/sh\ncat >/dev/null\n"), 0o755))
	_, err := h.provider("load", true).Create(context.Background(), testSpec(t))
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "the kernel does not list it")
	h.nothingCreated(t)
}

func TestLoadWithoutRootUsesTheLoadedProfileOrRefuses(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	_, err := h.provider("load", false).Create(context.Background(), testSpec(t))
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "oac-shim cannot load it (oac-shim is not root)")
	assert.Contains(t, err.Error(), "install examples/apparmor/oac-guest")
	h.nothingCreated(t)
	assert.Empty(t, h.parserRuns(t))

	h = newFakeHost(t, withAppArmor, apparmor.Name)
	in, err := h.provider("load", false).Create(context.Background(), testSpec(t))
	require.NoError(t, err)
	assert.Contains(t, created(t, in).Args(), "apparmor=oac-guest")
	assert.Empty(t, h.parserRuns(t))
}

func TestAnEngineWithoutAppArmorGetsNoProfile(t *testing.T) {
	for _, mode := range []string{"load", "require"} {
		h := newFakeHost(t, withoutAppArmor)
		in, err := h.provider(mode, true).Create(context.Background(), testSpec(t))
		require.NoError(t, err)
		assert.NotContains(t, strings.Join(created(t, in).Args(), " "), "apparmor", mode)
		assert.Empty(t, h.parserRuns(t), mode)
	}
}

func TestABadModeIsRefused(t *testing.T) {
	h := newFakeHost(t, withAppArmor)
	_, err := h.provider("unconfined", true).Create(context.Background(), testSpec(t))
	require.Error(t, err)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), `--docker-apparmor "unconfined": want load or require`)
	h.nothingCreated(t)
}

func TestCheckReportsWhatRunWouldDoAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	h := newFakeHost(t, withAppArmor)
	err := h.provider("require", true).Check(ctx)
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "install examples/apparmor/oac-guest")

	p := h.provider("load", true)
	require.NoError(t, p.Check(ctx))
	assert.Equal(t, []string{"-QK"}, h.parserRuns(t), "check compiles the profile it would load, and loads nothing")
	assert.Contains(t, p.Detail(ctx), "the Docker engine confines containers with AppArmor: they run under oac-guest (version 1), which oac-shim loads with apparmor_parser before each")

	h.setParser(t, "AppArmor parser error: Could not open 'tunables/global'")
	err = p.Check(ctx)
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "the parser refuses the profile oac-guest oac-shim would load")
	assert.Contains(t, err.Error(), "Could not open 'tunables/global'")

	h = newFakeHost(t, withoutAppArmor)
	p = h.provider("require", false)
	require.NoError(t, p.Check(ctx))
	assert.Contains(t, p.Detail(ctx), "the Docker engine does not confine containers with AppArmor")
	h.nothingCreated(t)
}

func TestTheContainerIsNeverUnconfined(t *testing.T) {
	for _, profile := range []string{"", "unconfined", apparmor.Name} {
		args := strings.Join(runArgs(runConfig{Name: "a", Image: "img", RunDir: "/r", AgentPath: "/g", AppArmor: profile}), " ")
		assert.NotContains(t, args, "unconfined", profile)
		assert.NotContains(t, args, "--privileged", profile)
	}
}

func TestAppArmorConfinesReadsTheEnginesReport(t *testing.T) {
	assert.True(t, appArmorConfines(withAppArmor))
	assert.False(t, appArmorConfines(withoutAppArmor))
	assert.False(t, appArmorConfines(`null`), "an engine that reports nothing")
}
