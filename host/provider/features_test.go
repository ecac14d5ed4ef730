package provider

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// honouring is a provider that honours some features.
type honouring struct {
	name string
	fs   []Feature
}

func (h honouring) Name() string                                 { return h.name }
func (honouring) Check(context.Context) error                    { return nil }
func (honouring) Create(context.Context, Spec) (Instance, error) { return nil, ErrUnavailable }
func (h honouring) Capabilities() Capabilities {
	return Capabilities{Honours: h.fs, Instead: map[Feature]string{FeatureVolume: "its distribution's disk holds /home"}}
}

// plain declares nothing.
type plain struct{}

func (plain) Name() string                                   { return "plain" }
func (plain) Capabilities() Capabilities                     { return Capabilities{} }
func (plain) Check(context.Context) error                    { return nil }
func (plain) Create(context.Context, Spec) (Instance, error) { return nil, ErrUnavailable }

func TestSpecFeaturesAreTheOptionalFlagsItSets(t *testing.T) {
	assert.Empty(t, Spec{Name: "a", AgentPath: "/g"}.Features())
	s := Spec{Rootfs: "/r", SandboxIOPath: "/s", Install: map[string]string{"x": "/x"}, Volumes: map[string]string{"/home": "/h"}}
	assert.Equal(t, AllFeatures, s.Features())
}

func TestRefuseNamesTheFlagTheProviderAndWhatToDo(t *testing.T) {
	s := Spec{Name: "a", AgentPath: "/g", Install: map[string]string{"tool": "/t"}, Volumes: map[string]string{"/home": "/h"}}
	assert.NoError(t, Refuse(honouring{"all", AllFeatures}, s))

	err := Refuse(honouring{"wsl", []Feature{FeatureRootfs}}, s)
	assert.ErrorIs(t, err, ErrInvalidSpec)
	assert.ErrorIs(t, err, ErrUnsupported)
	assert.EqualError(t, err, "invalid sandbox spec: --install: not supported by this provider: the wsl provider does not honour --install; put the binary into the guest image instead (oac-image build --file)")

	err = Refuse(honouring{"wsl", []Feature{FeatureRootfs, FeatureInstall}}, s)
	assert.EqualError(t, err, "invalid sandbox spec: --volume: not supported by this provider: the wsl provider does not honour --volume; its distribution's disk holds /home")

	err = Refuse(plain{}, Spec{Name: "a", AgentPath: "/g", SandboxIOPath: "/s"})
	assert.ErrorContains(t, err, "the plain provider does not honour --sandbox-io; put oac-sandbox-io into the guest image instead")
	assert.NoError(t, Refuse(plain{}, Spec{Name: "a", AgentPath: "/g"}), "a spec without optional features suits every provider")
	assert.Empty(t, Honours(plain{}), "a provider that says nothing honours nothing")
}

// claiming takes volumes at claim.
type claiming struct{ plain }

func (claiming) Name() string               { return "claiming" }
func (claiming) Capabilities() Capabilities { return Capabilities{ClaimVolumes: true} }

func TestClaimVolumesAreCheckedOnceForEveryProvider(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	assert.NoError(t, CheckClaimVolumes(plain{}, nil), "no volume suits every provider")
	assert.NoError(t, CheckClaimVolumes(claiming{}, map[string]string{"/home": dir, "/environment": dir}))

	err := CheckClaimVolumes(plain{}, map[string]string{"/home": dir})
	assert.ErrorIs(t, err, ErrUnsupported)
	assert.ErrorContains(t, err, "the plain provider cannot mount volumes into a warm sandbox at its claim")
	assert.ErrorContains(t, err, "boot the sandbox with --volume instead")

	for _, c := range []struct {
		vols map[string]string
		want string
	}{
		{map[string]string{"/etc": dir}, "a volume can replace only /home or /environment"},
		{map[string]string{"/home": "rel/dir"}, "is not an absolute path"},
		{map[string]string{"/home": dir + "/no"}, "no such file or directory"},
		{map[string]string{"/home": file}, "is not a directory"},
	} {
		err := CheckClaimVolumes(claiming{}, c.vols)
		assert.ErrorIs(t, err, ErrInvalidSpec)
		assert.NotErrorIs(t, err, ErrUnsupported)
		assert.ErrorContains(t, err, c.want)
	}
}
