//go:build unix || windows

package wsl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/manifest"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// Timeouts of wsl.exe commands that should return quickly.
const (
	quickTimeout = 30 * time.Second
	// importTimeout bounds `wsl.exe --import` (it unpacks the whole root
	// filesystem into a new virtual disk).
	importTimeout = 5 * time.Minute
)

// Provider runs each sandbox in a WSL2 distribution of its own, imported
// from a root filesystem tarball and removed again when the sandbox ends.
type Provider struct {
	// WSL is wsl.exe; default: %SystemRoot%\System32\wsl.exe, else PATH
	// (on other OSes there is none unless given).
	WSL string `flag:"wsl" meta:"PATH" usage:"wsl.exe to run (default: %SystemRoot%\\System32\\wsl.exe)"`
	// Rootfs is the root filesystem tarball (the image build's output)
	// imported for each sandbox; Spec.Rootfs overrides it.
	Rootfs string
	// Manifest is the pinned manifest (oac-image build --base-url
	// --wsl-installer writes it): its wsl-installer artifact for Windows
	// on this architecture is the installer named when WSL is missing or
	// too old. The driver's default: manifest.json beside oac-shim, when
	// there.
	Manifest string `flag:"manifest,path" meta:"FILE" usage:"the pinned manifest; its wsl-installer is named when WSL is missing or too old (default: manifest.json beside oac-shim, when there)"`
	// Store is the staging store oac-image stage fills
	// (STORE/sha256/HEX): where the pinned installer is looked for, and
	// verified, when WSL is missing or too old. Default
	// %LOCALAPPDATA%\oac\store (none outside Windows).
	Store string `flag:"store,path" meta:"DIR" usage:"the staging store oac-image stage fills; the pinned WSL installer is looked for there (default %LOCALAPPDATA%\\oac\\store)"`
	// StateRoot holds per-sandbox state and the distributions' disks;
	// default %LOCALAPPDATA%\oac.
	StateRoot string
	// Runner runs wsl.exe; default ExecRunner{WSL}.
	Runner Runner
	// Debug runs the agent with --debug.
	Debug bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "wsl" }

func init() {
	provider.Register(provider.Driver[Provider]{Name: "wsl", Note: "(--rootfs is the tarball)", New: func(p *Provider) provider.Provider {
		p.Rootfs = kit.BesideShim("oac-rootfs.tar.gz")
		if p.Manifest == "" {
			if m := kit.BesideShim("manifest.json"); m != "" {
				if _, err := os.Stat(m); err == nil {
					p.Manifest = m
				}
			}
		}
		return p
	}})
}

// Capabilities implements provider.Provider: --rootfs is the tarball
// each sandbox's distribution is imported from; what the guest runs must
// be in it (a distribution cannot see the Windows host's files the way a
// bind mount would show them); a kept sandbox is a registered
// distribution. A distribution runs on the utility VM's kernel, not the
// host's.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{
		GuestRootUnprivileged: true,
		Honours:               []provider.Feature{provider.FeatureRootfs},
		Instead: map[provider.Feature]string{
			provider.FeatureSandboxIO: "build it into the root filesystem tarball instead (oac-image build --sandbox-io)",
			provider.FeatureInstall:   "build the binary into the root filesystem tarball instead (oac-image build --file SRC:/usr/local/bin/NAME)",
			provider.FeatureVolume:    "a distribution's /home and /environment live on its own disk, which is deleted with the sandbox",
		},
		Keeps: true,
	}
}

func (p *Provider) wslPath() string {
	if p.WSL != "" {
		return p.WSL
	}
	return defaultWSL()
}

func (p *Provider) runner() Runner {
	if p.Runner != nil {
		return p.Runner
	}
	return ExecRunner{Path: p.wslPath()}
}

func (p *Provider) stateRoot() string {
	if p.StateRoot != "" {
		return p.StateRoot
	}
	return defaultStateRoot()
}

// Reset implements provider.Resetter: it unregisters a distribution the
// sandbox called name left behind (an unregister that failed), so that
// the next start imports a fresh one.
func (p *Provider) Reset(ctx context.Context, name string) error {
	in := &Instance{run: p.runner(), distro: DistroName(name)}
	names, err := in.list(ctx)
	if err != nil || !slices.Contains(names, in.distro) {
		return err
	}
	in.imported = true
	return in.unregister(ctx)
}

func (p *Provider) store() string {
	if p.Store != "" {
		return p.Store
	}
	return defaultStore()
}

// install says what to do when WSL is missing or too old: the pinned
// installer, where it is staged (verified here, so a damaged file is
// never offered), the command line to run and whether Windows must
// restart after; or how to stage it first.
func (p *Provider) install() string {
	const fallback = "install WSL (the app's bundled installer, or wsl.exe --install --no-distribution)"
	a, err := p.installer()
	switch {
	case err != nil:
		return fallback + "; " + err.Error()
	case a == nil:
		return fallback
	}
	plan := a.InstallPlan()
	after := "no restart is needed"
	if plan.Restart {
		after = "then restart Windows before WSL is used"
	}
	store := p.store()
	if store != "" {
		staged := manifest.StorePath(store, a.SHA256)
		err := manifest.VerifyFile(*a, staged)
		if err == nil {
			return fmt.Sprintf("install WSL with the pinned installer %s, staged and verified at %s: run %s; %s", a.FileName(), staged, InstallCommand(staged, plan), after)
		}
		if !errors.Is(err, manifest.ErrMissing) {
			// The store holds verified files only: this one was damaged
			// after staging. oac-image stage replaces it.
			return fmt.Sprintf("install WSL with the pinned installer %s: the staged file does not verify (%v); stage it again (oac-image stage --store %s --manifest %s --name %s), then run %s; %s",
				a.FileName(), err, store, p.Manifest, a.Name, InstallCommand(staged, plan), after)
		}
	}
	from := a.URL
	if n := len(a.Mirrors); n > 0 {
		from = fmt.Sprintf("%s (or %d mirrors)", a.URL, n)
	}
	storeArg := store
	if storeArg == "" {
		storeArg = "DIR"
	}
	staged := manifest.StorePath(storeArg, a.SHA256)
	return fmt.Sprintf("install WSL with the pinned installer %s (%d bytes, sha256 %s) from %s: not staged yet; stage it (oac-image stage --store %s --manifest %s --name %s, which verifies it), then run %s; %s",
		a.FileName(), a.Size, a.SHA256, from, storeArg, p.Manifest, a.Name, InstallCommand(staged, plan), after)
}

// InstallCommand is the command line that runs the WSL installer (an
// MSI) staged at path: msiexec.exe /i "PATH" and the plan's arguments
// (plain words: the manifest refuses spaces and quotes in them).
func InstallCommand(path string, plan manifest.Install) string {
	return strings.Join(append([]string{"msiexec.exe", "/i", `"` + path + `"`}, plan.Args...), " ")
}

// installer returns the manifest's wsl-installer artifact for Windows on
// this architecture; nil without a manifest.
func (p *Provider) installer() (*manifest.Artifact, error) {
	if p.Manifest == "" {
		return nil, nil
	}
	f, err := os.Open(p.Manifest)
	if err != nil {
		return nil, fmt.Errorf("the pinned manifest cannot be read: %w", err)
	}
	defer f.Close()
	m, err := manifest.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("the pinned manifest %s: %w", p.Manifest, err)
	}
	arts := m.Find("", manifest.KindWSLInstaller, "windows", runtime.GOARCH)
	if len(arts) == 0 {
		return nil, fmt.Errorf("the pinned manifest %s has no %s for windows/%s (oac-image build --wsl-installer adds it)", p.Manifest, manifest.KindWSLInstaller, runtime.GOARCH)
	}
	return &arts[0], nil
}

// Version returns the installed WSL's version, or an error wrapping
// provider.ErrUnavailable that says what to install.
func (p *Provider) Version(ctx context.Context) (string, error) {
	if p.Runner == nil && p.wslPath() == "" {
		if onlyOnWindows != "" {
			return "", fmt.Errorf("%w: wsl: %s", provider.ErrUnavailable, onlyOnWindows)
		}
		return "", fmt.Errorf("%w: wsl: wsl.exe not found: %s", provider.ErrUnavailable, p.install())
	}
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	out, err := p.runner().Output(ctx, versionArgs()...)
	text := decode(out)
	v, ok := parseVersion(text)
	if err != nil || !ok {
		return "", fmt.Errorf("%w: wsl: WSL is not installed, or is the Windows component without --version (too old): %s", provider.ErrUnavailable, p.install())
	}
	if !versionAtLeast(v, MinVersion) {
		return v, fmt.Errorf("%w: wsl: WSL %s is older than %s: %s", provider.ErrUnavailable, v, MinVersion, p.install())
	}
	return v, nil
}

func (p *Provider) tarball(spec provider.Spec) (string, error) {
	t := spec.Rootfs
	if t == "" {
		t = p.Rootfs
	}
	if t == "" {
		return "", errors.New("no root filesystem tarball given (--rootfs FILE.tar.gz, the image build's output)")
	}
	st, err := os.Stat(t)
	if err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("root filesystem tarball %s is not a readable file", t)
	}
	return filepath.Abs(t)
}

// Check implements provider.Provider: WSL is present and recent enough and
// the default root filesystem tarball exists.
func (p *Provider) Check(ctx context.Context) error {
	if _, err := p.Version(ctx); err != nil {
		return err
	}
	if _, err := p.tarball(provider.Spec{}); err != nil {
		return fmt.Errorf("%w: wsl: %v", provider.ErrUnavailable, err)
	}
	return nil
}

// Detail describes how sandboxes would run here.
func (p *Provider) Detail(ctx context.Context) string {
	v, err := p.Version(ctx)
	if err != nil {
		return ""
	}
	t, _ := p.tarball(provider.Spec{})
	return fmt.Sprintf("WSL %s; each sandbox is a WSL2 distribution of its own, imported from %s", v, t)
}

// Create implements provider.Provider: it imports the sandbox's
// distribution (removing a stale one of the same name first).
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if _, err := p.Version(ctx); err != nil {
		return nil, err
	}
	tar, err := p.tarball(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: wsl: %v", provider.ErrInvalidSpec, err)
	}
	in := &Instance{Process: provider.NewProcess(provider.Exits("the agent's wsl.exe exited with status 0", "sandbox runtime exited: wsl.exe"), errors.New("wsl.exe did not exit within 10s of being killed")), p: p, run: p.runner(), spec: spec, distro: DistroName(spec.Name), tarball: tar}
	defer in.DestroyOnError(&err)
	state, err := kit.ClaimState(in.Process, p.stateRoot(), spec.Name)
	if err != nil {
		return nil, err
	}
	in.dir = filepath.Join(state.Path, "distro")
	if spec.Keep != nil {
		in.dir = filepath.Join(spec.Keep.Dir, KeptDistroDir)
	}
	// Destroy unregisters the distribution (which deletes its disk); a
	// kept sandbox's stays registered (only Discard unregisters it).
	in.OnDestroy(func() error {
		if in.kept {
			return nil
		}
		return in.unregister(context.Background())
	})
	// Kill terminates the distribution (every process in it), then the
	// wsl.exe that ran the agent.
	in.KillBy(in.terminate)
	names, err := in.list(ctx)
	if err != nil {
		return nil, err
	}
	if spec.Keep != nil {
		if err := in.keep(ctx, spec.Keep.Dir, slices.Contains(names, in.distro)); err != nil {
			return nil, err
		}
		return in, nil
	}
	// We hold the name's lock: a distribution of that name is a leftover.
	if slices.Contains(names, in.distro) {
		if err := in.wsl(ctx, quickTimeout, "unregister stale "+in.distro, unregisterArgs(in.distro)...); err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	if err := in.importDistro(ctx); err != nil {
		return nil, err
	}
	return in, nil
}

// Instance is one sandbox's WSL distribution; the embedded Process is
// the wsl.exe running its agent.
type Instance struct {
	*provider.Process
	p       *Provider
	run     Runner
	spec    provider.Spec
	distro  string
	tarball string
	dir     string

	mu       sync.Mutex
	imported bool
	// kept: the distribution is a kept sandbox's, registered until
	// Discard; imageChanged says how its tarball changed since.
	kept         bool
	imageChanged string
}

// What a kept sandbox holds in its directory.
const (
	// KeptDistroDir is the distribution's directory (its virtual disk).
	KeptDistroDir = "distro"
	// KeptRecordName records the tarball the distribution was imported
	// from. It is written before the import, so a directory with it may
	// have a registered distribution, and one without it has none.
	KeptRecordName = "distro.json"
)

// keep uses the distribution an earlier run of the kept sandbox left
// registered (registered) or imports it into dir.
func (in *Instance) keep(ctx context.Context, dir string, registered bool) error {
	recPath := filepath.Join(dir, KeptRecordName)
	rec, rerr := kit.ReadImageRecord(recPath)
	if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return rerr
	}
	if registered && rerr == nil {
		in.mu.Lock()
		in.imported, in.kept = true, true
		in.mu.Unlock()
		in.imageChanged = rec.Changed(in.tarball, "its distribution imported")
		return nil
	}
	if registered {
		// Registered but never recorded here: not this sandbox's.
		return fmt.Errorf("%w: wsl: a distribution %s is registered that this kept sandbox did not import: unregister it (wsl.exe --unregister %s), or discard the sandbox", provider.ErrExists, in.distro, in.distro)
	}
	// First start, or the distribution was unregistered behind our
	// back: import (again) from the tarball.
	rec, err := kit.RecordImage(in.tarball)
	if err != nil {
		return fmt.Errorf("wsl: read %s: %w", in.tarball, err)
	}
	if err := kit.WriteImageRecord(recPath, rec); err != nil {
		return err
	}
	if err := os.RemoveAll(in.dir); err != nil {
		return fmt.Errorf("wsl: %w", err)
	}
	if err := in.importDistro(ctx); err != nil {
		return err
	}
	in.mu.Lock()
	in.kept = true
	in.mu.Unlock()
	return nil
}

// ImageChanged implements provider.ImageChecker.
func (in *Instance) ImageChanged() string { return in.imageChanged }

// Discard implements provider.Keeper: it unregisters the kept sandbox's
// distribution (which deletes its virtual disk) when this sandbox
// imported it, and removes the distribution's directory and the record
// from dir.
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	if err := kit.DiscardRuntime(p.stateRoot(), name, nil); err != nil {
		return err
	}
	recPath := filepath.Join(dir, KeptRecordName)
	if _, err := os.Stat(recPath); err == nil {
		in := &Instance{run: p.runner(), distro: DistroName(name)}
		names, err := in.list(ctx)
		if err != nil {
			return err
		}
		if slices.Contains(names, in.distro) {
			in.imported = true
			if err := in.unregister(ctx); err != nil {
				return err
			}
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, KeptDistroDir)); err != nil {
		return fmt.Errorf("wsl: %w", err)
	}
	for _, f := range []string{recPath, recPath + ".part"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("wsl: %w", err)
		}
	}
	return nil
}

// Distro returns the WSL distribution's name.
func (in *Instance) Distro() string { return in.distro }

// wsl runs one wsl.exe command to completion.
func (in *Instance) wsl(ctx context.Context, timeout time.Duration, what string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := in.run.Output(ctx, args...)
	if err != nil {
		return classify(what, decode(out), err)
	}
	return nil
}

func (in *Instance) list(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	out, err := in.run.Output(ctx, listArgs()...)
	text := decode(out)
	if err != nil {
		// With no distribution at all, wsl.exe --list fails and says so.
		cerr := classify("list distributions", text, err)
		if errors.Is(cerr, ErrNotFound) {
			return nil, nil
		}
		return nil, cerr
	}
	return parseList(text), nil
}

func (in *Instance) importDistro(ctx context.Context) error {
	if err := os.MkdirAll(in.dir, 0o700); err != nil {
		return fmt.Errorf("wsl: create %s: %w", in.dir, err)
	}
	if err := in.wsl(ctx, importTimeout, "import "+in.distro, importArgs(in.distro, in.dir, in.tarball)...); err != nil {
		return err
	}
	in.mu.Lock()
	in.imported = true
	in.mu.Unlock()
	return nil
}

// Start implements provider.Instance: wsl.exe runs the agent as root in
// the distribution, speaking the session over the process's stdin and
// stdout, which Accept hands out once.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("wsl", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	in.mu.Lock()
	imported := in.imported
	in.mu.Unlock()
	if !imported {
		return fmt.Errorf("%w: wsl: %s is not imported", provider.ErrNotStarted, in.distro)
	}
	in.mu.Lock()
	kept := in.kept
	in.mu.Unlock()
	proc, err := in.run.Start(agentArgs(in.distro, in.p.Debug, kept), in.spec.Stderr)
	if err != nil {
		return err
	}
	in.Watch(proc)
	conn := transport.StreamConn(proc.Stdout(), proc.Stdin(), "wsl:"+in.distro)
	in.Own(conn)
	ln := provider.ConnListener(conn)
	in.Own(ln)
	in.Listen(ln)
	return nil
}

// terminate is the Instance's Kill.
func (in *Instance) terminate() error {
	if !in.Started() {
		return nil
	}
	terr := in.wsl(context.Background(), quickTimeout, "terminate "+in.distro, terminateArgs(in.distro)...)
	if errors.Is(terr, ErrNotFound) {
		terr = nil
	}
	if err := in.KillProcess(); err != nil {
		return errors.Join(terr, err)
	}
	return terr
}

func (in *Instance) unregister(ctx context.Context) error {
	in.mu.Lock()
	imported := in.imported
	in.imported = false
	in.mu.Unlock()
	if !imported {
		return nil
	}
	err := in.wsl(ctx, quickTimeout, "unregister "+in.distro, unregisterArgs(in.distro)...)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}
