package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/protocol"
)

const quickTimeout = 30 * time.Second

func (p *Provider) driver() provider.Provider { return p }

func (p *Provider) docker() (string, error) {
	return kit.Binary("docker", p.Docker, "docker", "the docker client is not installed (apt-get install docker.io, or Docker Engine: https://docs.docker.com/engine/install/)")
}

// output runs the docker client to completion.
func output(ctx context.Context, docker string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, docker, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = "/"
	err := cmd.Run()
	return out.String(), err
}

// engine is what Check found: the client, the engine's version and
// security options, the image's id and how the container gets the
// guest's AppArmor profile.
type engine struct {
	client, version, imageID string
	// security is `docker info`'s SecurityOptions, as JSON.
	security string
	// noImage is the engine's refusal of the image, as an ErrInvalidSpec
	// for Create (Check reports it as ErrUnavailable).
	noImage error
	aa      apparmor.Plan
}

// appArmorFlag names the provider's AppArmor mode in messages.
const appArmorFlag = "--docker-apparmor"

// check finds what the provider needs, in order: a client, a reachable
// engine, an image given and present, and, where the engine confines
// containers with AppArmor, the guest's profile loaded or oac-shim's
// leave to load it. The error wraps ErrUnavailable (or, for the profile,
// apparmor.ErrProfileMissing) and names the first missing piece and how
// to get it.
func (p *Provider) check(ctx context.Context) (engine, error) {
	var e engine
	d, err := p.docker()
	if err != nil {
		return e, err
	}
	e.client = d
	out, err := output(ctx, d, versionArgs()...)
	if err != nil {
		if cerr := classify("version", out, err); errors.Is(cerr, provider.ErrUnavailable) {
			return e, fmt.Errorf("%w (client %s)", cerr, d)
		}
		return e, fmt.Errorf("%w: docker: no Docker engine reachable: %s (client %s)", provider.ErrUnavailable, strings.TrimSpace(out), d)
	}
	e.version = strings.TrimSpace(out)
	if p.Image == "" {
		return e, fmt.Errorf("%w: docker: no guest image given (--docker-image IMAGE; docker import the image build's rootfs.tar.gz IMAGE) (client %s, engine %s)", provider.ErrUnavailable, d, e.version)
	}
	out, err = output(ctx, d, imageArgs(p.Image)...)
	if err != nil {
		cerr := classify("image "+p.Image, out, err)
		if errors.Is(cerr, provider.ErrInvalidSpec) {
			e.noImage = cerr
			return e, fmt.Errorf("%w: docker: image %s is not in the engine (docker import the image build's rootfs.tar.gz %s; the provider never pulls) (client %s, engine %s)",
				provider.ErrUnavailable, p.Image, p.Image, d, e.version)
		}
		return e, cerr
	}
	e.imageID = strings.TrimSpace(out)
	mode, err := apparmor.ParseMode(appArmorFlag, p.AppArmor)
	if err != nil {
		return e, fmt.Errorf("%w: docker: %v", provider.ErrInvalidSpec, err)
	}
	out, err = output(ctx, d, securityArgs()...)
	if err != nil {
		return e, classify("info (the engine's security options)", out, err)
	}
	e.security = strings.TrimSpace(out)
	e.aa, err = p.aa.Decide(mode, appArmorConfines(e.security), appArmorFlag, "the Docker engine")
	if err != nil {
		return e, fmt.Errorf("docker: %w", err)
	}
	return e, nil
}

// Check implements provider.Provider: a client, a reachable engine, the
// image to run and the guest's AppArmor profile where the engine
// confines with AppArmor (the profile oac-shim would load compiled by the
// parser, not loaded: check changes nothing).
func (p *Provider) Check(ctx context.Context) error {
	e, err := p.check(ctx)
	if err == nil && e.aa.Load {
		if verr := p.aa.Validate(ctx, apparmor.Profile(apparmor.HostIncludes())); verr != nil {
			return fmt.Errorf("docker: %w: the parser refuses the profile %s oac-shim would load: %v; %s, and run with %s require",
				apparmor.ErrProfileMissing, apparmor.Name, verr, apparmor.Install, appArmorFlag)
		}
	}
	return err
}

// Detail says what was found and whether the engine maps container root
// away from host root.
func (p *Provider) Detail(ctx context.Context) string {
	e, err := p.check(ctx)
	if err != nil {
		return ""
	}
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "the default socket"
	}
	s := fmt.Sprintf("client %s, engine %s at %s, image %s (%s); ", e.client, e.version, host, p.Image, shortID(e.imageID))
	if usernsRemapped(e.security) {
		s += "the engine remaps user namespaces: guest root is an unprivileged host id"
	} else {
		s += "the engine runs without userns-remap: guest root is host root with capabilities " + strings.Join(AgentCaps, ", ") + " only"
	}
	return s + "; " + e.aa.How
}

func shortID(id string) string {
	if len(id) > 19 {
		return id[:19]
	}
	return id
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: docker runs an image (--docker-image), not a --rootfs directory", provider.ErrInvalidSpec)
	}
	e, err := p.check(ctx)
	if e.noImage != nil {
		return nil, e.noImage
	}
	if err != nil {
		return nil, err
	}
	d := e.client
	hp, err := kit.CheckHostPaths(spec)
	if err != nil {
		return nil, err
	}
	if e.aa.Load {
		// Before anything of the sandbox exists: a profile the kernel
		// refuses leaves nothing behind. Loading replaces any older
		// version with the one this oac-guest's launcher needs.
		if err := p.aa.Load(ctx, apparmor.Profile(apparmor.HostIncludes())); err != nil {
			return nil, fmt.Errorf("docker: %w: the Docker engine confines containers with AppArmor and the profile %s could not be loaded: %v; %s, and run with %s require",
				apparmor.ErrProfileMissing, apparmor.Name, err, apparmor.Install, appArmorFlag)
		}
	}
	cfg := runConfig{Name: spec.Name, Image: p.Image, Hostname: spec.Hostname, AgentPath: hp.Agent, Volumes: hp.Volumes, Installs: hp.Installs, AppArmor: e.aa.Profile, Debug: p.Debug}
	in := &Instance{Process: provider.NewProcess(provider.Exits("container exited (docker run returned status 0)", "sandbox runtime exited: docker run"), errors.New("docker run did not exit within 10s of SIGKILL")), spec: spec, docker: d}
	defer in.DestroyOnError(&err)
	state, err := kit.ClaimState(in.Process, kit.StateRoot(p.StateRoot), spec.Name)
	if err != nil {
		return nil, err
	}
	have, err := inspectContainer(ctx, d, spec.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case have != nil && have.kept && spec.Keep == nil:
		return nil, fmt.Errorf("%w: docker: %s is a kept sandbox's container: start that sandbox, or discard it first", provider.ErrExists, ContainerName(spec.Name))
	case have != nil && have.sandbox != spec.Name:
		return nil, fmt.Errorf("%w: docker: a container %s exists that oac did not make for this sandbox: remove or rename it", provider.ErrExists, ContainerName(spec.Name))
	case spec.Keep == nil || (have != nil && !have.kept):
		// We hold the name's lock: a container of that name is a
		// leftover.
		if err := removeContainer(ctx, d, spec.Name, "remove stale container"); err != nil {
			return nil, err
		}
		have = nil
	}
	if spec.Keep == nil {
		// Destroy removes the container (--rm does not run when the
		// client was killed).
		in.OnDestroy(in.remove)
	}
	in.cfg = cfg
	in.cfg.Kept = spec.Keep != nil
	in.cfg.ResolvConf = filepath.Join(state.Path, "resolv.conf")
	if err := os.WriteFile(in.cfg.ResolvConf, []byte(protocol.ResolvConf), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", in.cfg.ResolvConf, err)
	}
	profile, err := kit.ContainerSeccompProfile()
	if err != nil {
		return nil, err
	}
	in.cfg.Seccomp = filepath.Join(state.Path, "seccomp.json")
	if err := os.WriteFile(in.cfg.Seccomp, profile, 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", in.cfg.Seccomp, err)
	}
	run, ln, err := kit.RunDir(state.Path)
	if ln != nil {
		in.Own(ln)
		in.ListenData(ln, protocol.CapDataFD, protocol.CapDataDial)
	}
	if err != nil {
		return nil, err
	}
	in.cfg.RunDir = run
	if in.cfg.Kept {
		if err := in.keep(ctx, have, e.imageID); err != nil {
			return nil, err
		}
	}
	// docker kill first: the container's pid namespace goes down with it.
	in.KillBy(func() error {
		return in.KillAsking(func() { _, _ = output(context.Background(), in.docker, killArgs(in.cfg.Name)...) }, 5*time.Second)
	})
	return in, nil
}

// Instance is one container; the embedded Process is the attached
// `docker run` (or, kept, `docker start --attach`) client, which lives as
// long as the container.
type Instance struct {
	*provider.Process
	spec   provider.Spec
	docker string
	cfg    runConfig
	// imageChanged says how the image changed since a kept sandbox's
	// container was made.
	imageChanged string
}

// keep makes a kept sandbox's container, or checks the one an earlier run
// made (have): its settings must be this run's; a container made from
// another image than the one --docker-image names now runs its own until
// reset, which is said.
func (in *Instance) keep(ctx context.Context, have *container, imageID string) error {
	if have != nil {
		if have.config != configDigest(in.cfg) {
			return fmt.Errorf("%w: docker: the kept sandbox's container %s was made with other settings (installs, volumes, hostname or agent): start it with the same ones, or reset it", provider.ErrInvalidSpec, ContainerName(in.cfg.Name))
		}
		if have.running {
			// Its shim was killed (the attached client with it): the
			// guest in it waits for a host that is gone.
			if out, err := output(ctx, in.docker, stopArgs(in.cfg.Name)...); err != nil {
				return classify("stop the kept container a killed shim left running", out, err)
			}
		}
		if have.image != imageID {
			in.imageChanged = fmt.Sprintf("the image %s is now %s, not the %s this sandbox's container was made from: it keeps running the old one until reset", in.cfg.Image, shortID(imageID), shortID(have.image))
		}
		return nil
	}
	out, err := output(ctx, in.docker, createArgs(in.cfg)...)
	if err != nil {
		return classify("create the kept container", out, err)
	}
	// A first create that fails after this removes what it made.
	in.OnDestroy(func() error {
		if in.Started() {
			return nil
		}
		return removeContainer(context.Background(), in.docker, in.cfg.Name, "remove the kept container")
	})
	return nil
}

// ImageChanged implements provider.ImageChecker.
func (in *Instance) ImageChanged() string { return in.imageChanged }

// Discard implements provider.Keeper: a kept docker sandbox is its
// container (with its writable layer and any anonymous volume); nothing
// is kept in dir. A throwaway container of the name that a killed shim
// left goes too; a container of that name not made for the sandbox is
// left alone.
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	d, err := p.docker()
	if err != nil {
		return err
	}
	return kit.DiscardRuntime(kit.StateRoot(p.StateRoot), name, func() error {
		have, err := inspectContainer(ctx, d, name)
		if err != nil || have == nil || have.sandbox != name {
			return err
		}
		return removeUntilGone(ctx, d, "discard the container", discardArgs(name))
	})
}

// inspectContainer returns what the engine has under the sandbox's
// container name, or nil.
func inspectContainer(ctx context.Context, docker, name string) (*container, error) {
	out, err := output(ctx, docker, inspectArgs(name)...)
	if err != nil {
		cerr := classify("inspect container", out, err)
		if errors.Is(cerr, ErrNoContainer) {
			return nil, nil
		}
		return nil, cerr
	}
	c, err := parseInspect(out)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Args returns the docker client's arguments for the container (for a
// kept sandbox, those that made its container).
func (in *Instance) Args() []string {
	if in.cfg.Kept {
		return createArgs(in.cfg)
	}
	return runArgs(in.cfg)
}

// Start implements provider.Instance: `docker run` attached, so the
// client lives as long as the container and relays its output.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("docker", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	args := runArgs(in.cfg)
	if in.cfg.Kept {
		args = startArgs(in.cfg.Name)
	}
	cmd := exec.Command(in.docker, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := in.StartPiped(cmd, in.spec.Stderr); err != nil {
		return fmt.Errorf("start docker: %w", err)
	}
	return nil
}

// remove removes a started container from the engine.
func (in *Instance) remove() error {
	if !in.Started() {
		return nil
	}
	return removeContainer(context.Background(), in.docker, in.cfg.Name, "remove container")
}

// removeContainer removes sandbox name's container, if any, and returns
// once the engine has none: a container whose own removal is under way
// (--rm after its guest stopped, when its shim was killed) is waited for.
func removeContainer(ctx context.Context, docker, name, what string) error {
	return removeUntilGone(ctx, docker, what, removeArgs(name))
}

// removeUntilGone runs docker with args (a removal) until the engine has
// no such container, waiting out a removal already under way, for at
// most quickTimeout.
func removeUntilGone(ctx context.Context, docker, what string, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	for {
		out, err := output(ctx, docker, args...)
		if err == nil {
			return nil
		}
		cerr := classify(what, out, err)
		switch {
		case errors.Is(cerr, ErrNoContainer):
			return nil
		case !errors.Is(cerr, errRemoving):
			return cerr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the engine did not finish removing it within %s)", cerr, quickTimeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
