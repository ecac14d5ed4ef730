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

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/protocol"
)

const quickTimeout = 30 * time.Second

func (p *Provider) driver() provider.Provider { return p }

func (p *Provider) docker() (string, error) {
	return kit.Binary("docker", p.Docker, "docker", "the docker client is not installed (install Docker Engine: https://docs.docker.com/engine/install/)")
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

// Check implements provider.Provider: a client, a reachable engine and an
// image to run.
func (p *Provider) Check(ctx context.Context) error {
	d, err := p.docker()
	if err != nil {
		return err
	}
	if out, err := output(ctx, d, versionArgs()...); err != nil {
		if cerr := classify("version", out, err); errors.Is(cerr, provider.ErrUnavailable) {
			return cerr
		}
		return fmt.Errorf("%w: docker: no Docker engine reachable: %s", provider.ErrUnavailable, strings.TrimSpace(out))
	}
	if p.Image == "" {
		return fmt.Errorf("%w: docker: no guest image given (--docker-image IMAGE)", provider.ErrUnavailable)
	}
	return nil
}

// Detail says whether the engine maps container root away from host root.
func (p *Provider) Detail(ctx context.Context) string {
	d, err := p.docker()
	if err != nil {
		return ""
	}
	out, err := output(ctx, d, securityArgs()...)
	if err == nil && usernsRemapped(out) {
		return "image " + p.Image + "; the engine remaps user namespaces: guest root is an unprivileged host id"
	}
	return "image " + p.Image + "; the engine runs without userns-remap: guest root is host root with capabilities KILL, SETGID and SETUID only"
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: docker runs an image (--docker-image), not a --rootfs directory", provider.ErrInvalidSpec)
	}
	if err := p.Check(ctx); err != nil {
		return nil, err
	}
	d, _ := p.docker()
	if st, err := os.Stat(spec.AgentPath); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: agent binary %s is not a regular file (build it with make build)", provider.ErrInvalidSpec, spec.AgentPath)
	}
	if out, err := output(ctx, d, imageArgs(p.Image)...); err != nil {
		return nil, classify("image "+p.Image, out, err)
	}
	in := &Instance{Process: provider.NewProcess(provider.Exits("container exited (docker run returned status 0)", "sandbox runtime exited: docker run"), errors.New("docker run did not exit within 10s of SIGKILL")), spec: spec, docker: d}
	defer in.DestroyOnError(&err)
	state, err := kit.ClaimState(in.Process, kit.StateRoot(p.StateRoot), spec.Name)
	if err != nil {
		return nil, err
	}
	// We hold the name's lock: a container of that name is a leftover.
	if out, err := output(ctx, d, removeArgs(spec.Name)...); err != nil {
		if cerr := classify("remove stale container", out, err); !errors.Is(cerr, ErrNoContainer) {
			return nil, cerr
		}
	}
	// Destroy removes the container (--rm does not run when the client
	// was killed).
	in.OnDestroy(in.remove)
	agent, err := filepath.Abs(spec.AgentPath)
	if err != nil {
		return nil, err
	}
	in.cfg = runConfig{Name: spec.Name, Image: p.Image, Hostname: spec.Hostname, AgentPath: agent, Debug: p.Debug}
	run, ln, err := kit.RunDir(state.Path)
	if ln != nil {
		in.Own(ln)
		in.ListenData(ln, protocol.CapDataFD, protocol.CapDataDial)
	}
	if err != nil {
		return nil, err
	}
	in.cfg.RunDir = run
	// docker kill first: the container's pid namespace goes down with it.
	in.KillBy(func() error {
		return in.KillAsking(func() { _, _ = output(context.Background(), in.docker, killArgs(in.cfg.Name)...) }, 5*time.Second)
	})
	return in, nil
}

// Instance is one container; the embedded Process is the attached
// `docker run` client, which lives as long as the container.
type Instance struct {
	*provider.Process
	spec   provider.Spec
	docker string
	cfg    runConfig
}

// Args returns the docker client's arguments for the container.
func (in *Instance) Args() []string { return runArgs(in.cfg) }

// Start implements provider.Instance: `docker run` attached, so the
// client lives as long as the container and relays its output.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("docker", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	cmd := exec.Command(in.docker, runArgs(in.cfg)...)
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
	if out, err := output(context.Background(), in.docker, removeArgs(in.cfg.Name)...); err != nil {
		if cerr := classify("remove container", out, err); !errors.Is(cerr, ErrNoContainer) {
			return cerr
		}
	}
	return nil
}
