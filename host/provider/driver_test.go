package provider

import (
	"context"
	"flag"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type vmSettings struct {
	Kernel string        `flag:"kernel,path" meta:"FILE" usage:"kernel"`
	Memory int           `flag:"memory" meta:"MIB" usage:"memory"`
	Grace  time.Duration `flag:"host-grace" meta:"DUR" usage:"grace"`
}

type testDriverA struct {
	vmSettings
	Fast  bool   `flag:"fast" usage:"go fast"`
	Image string `flag:"image" meta:"!IMAGE" usage:"the image"`
	Inner string // no flag
}

type testDriverB struct {
	Kernel string `flag:"kernel,path" meta:"FILE" usage:"its kernel"`
	Memory int    `flag:"memory" meta:"MIB" usage:"its memory"`
	Strict bool   `flag:"strict" usage:"be strict"`
}

// settingsProvider hands its settings back to the test.
type settingsProvider struct{ settings any }

func (settingsProvider) Name() string                { return "settings" }
func (settingsProvider) Capabilities() Capabilities  { return Capabilities{} }
func (settingsProvider) Check(context.Context) error { return nil }
func (settingsProvider) Create(context.Context, Spec) (Instance, error) {
	return nil, ErrUnavailable
}

func TestDriversDeclareTheirFlagsAndShareOnesOfTheSameName(t *testing.T) {
	Register(Driver[testDriverA]{Name: "zz-a", New: func(s *testDriverA) Provider { return settingsProvider{s} }})
	Register(Driver[testDriverB]{Name: "zz-b", Defaults: &testDriverB{Strict: true, Memory: 512}, Note: "(a note)",
		New: func(s *testDriverB) Provider { return settingsProvider{s} }})
	t.Cleanup(func() { Unregister("zz-a"); Unregister("zz-b") })
	assert.Panics(t, func() { Register(Driver[testDriverB]{Name: "zz-b", New: func(*testDriverB) Provider { return nil }}) })

	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	news := Declare(fs)
	require.NoError(t, fs.Parse([]string{"--kernel", "vmlinuz", "--fast", "--host-grace", "5s", "--strict=false", "--image", "img"}))
	a := news["zz-a"]().(settingsProvider).settings.(*testDriverA)
	b := news["zz-b"]().(settingsProvider).settings.(*testDriverB)
	abs, err := filepath.Abs("vmlinuz")
	require.NoError(t, err)
	assert.Equal(t, abs, a.Kernel, "a path flag is made absolute")
	assert.Equal(t, a.Kernel, b.Kernel, "a shared flag sets both drivers")
	assert.Equal(t, 0, a.Memory, "each driver keeps its own default")
	assert.Equal(t, 512, b.Memory)
	assert.True(t, a.Fast)
	assert.False(t, b.Strict)
	assert.Equal(t, 5*time.Second, a.Grace)
	assert.Equal(t, "img", a.Image)
	assert.Equal(t, "zz-a: kernel; zz-b: its kernel", fs.Lookup("kernel").Usage)

	u := Usage()
	assert.Equal(t, "[--kernel FILE] [--memory MIB] [--host-grace DUR] [--fast] --image IMAGE", u["zz-a"])
	assert.Equal(t, "[--kernel FILE] [--memory MIB] [--strict=false] (a note)", u["zz-b"])
}
