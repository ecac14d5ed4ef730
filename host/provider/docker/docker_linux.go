package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// DefaultStateRoot holds per-sandbox state (shared with the other
// providers).
const DefaultStateRoot = "/run/oac"

const quickTimeout = 30 * time.Second

// Provider runs guests as containers of a Docker engine through the docker
// command line client.
type Provider struct {
	// Docker is the docker client; default: found in PATH.
	Docker string
	// Image is the guest image (required); it is never pulled.
	Image string
	// StateRoot holds per-sandbox state; default DefaultStateRoot.
	StateRoot string
	Debug     bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "docker" }

func (p *Provider) docker() (string, error) {
	if p.Docker != "" {
		return p.Docker, nil
	}
	path, err := exec.LookPath("docker")
	if err != nil {
		return "", fmt.Errorf("%w: docker: the docker client is not installed (install Docker Engine: https://docs.docker.com/engine/install/)", provider.ErrUnavailable)
	}
	return path, nil
}

func (p *Provider) stateRoot() string {
	if p.StateRoot != "" {
		return p.StateRoot
	}
	return DefaultStateRoot
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
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.Instance, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
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
	in := &Instance{spec: spec, docker: d, proc: newProcess()}
	ok := false
	defer func() {
		if !ok {
			in.release()
		}
	}()
	state, err := statedir.Claim(p.stateRoot(), spec.Name)
	if err != nil {
		return nil, err
	}
	in.state = state
	// We hold the name's lock: a container of that name is a leftover.
	if out, err := output(ctx, d, removeArgs(spec.Name)...); err != nil {
		if cerr := classify("remove stale container", out, err); !errors.Is(cerr, ErrNoContainer) {
			return nil, cerr
		}
	}
	agent, err := filepath.Abs(spec.AgentPath)
	if err != nil {
		return nil, err
	}
	in.cfg = runConfig{Name: spec.Name, Image: p.Image, Hostname: spec.Hostname, RunDir: filepath.Join(state.Path, "run"), AgentPath: agent, Debug: p.Debug}
	if err := os.Mkdir(in.cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", in.cfg.RunDir, err)
	}
	if err := os.WriteFile(filepath.Join(in.cfg.RunDir, "oac-guest"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("create agent mount point: %w", err)
	}
	sock := filepath.Join(in.cfg.RunDir, "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	in.ln = ln
	if err := os.Chmod(sock, 0o600); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", sock, err)
	}
	ok = true
	return in, nil
}

// Instance is one container.
type Instance struct {
	spec   provider.Spec
	docker string
	cfg    runConfig
	state  *statedir.Dir
	ln     *net.UnixListener

	mu   sync.Mutex // serializes Start
	proc *provider.Process
}

// newProcess returns the `docker run` client of an Instance, not started.
func newProcess() *provider.Process {
	return provider.NewProcess(func(err error) error {
		if err == nil {
			return errors.New("container exited (docker run returned status 0)")
		}
		return fmt.Errorf("sandbox runtime exited: docker run: %w", err)
	}, errors.New("docker run did not exit within 10s of SIGKILL"))
}

// Args returns the docker client's arguments for the container.
func (in *Instance) Args() []string { return runArgs(in.cfg) }

// HostPID returns the pid of the `docker run` client, 0 before Start.
func (in *Instance) HostPID() int { return in.proc.HostPID() }

// Start implements provider.Instance: `docker run` attached, so the
// client lives as long as the container and relays its output.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.proc.Started() {
		return errors.New("docker: already started")
	}
	cmd := exec.Command(in.docker, runArgs(in.cfg)...)
	cmd.Dir = "/"
	var out io.Writer = io.Discard
	if in.spec.Stderr != nil {
		out = in.spec.Stderr
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("docker: output pipe: %w", err)
	}
	defer pw.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	go func() {
		defer pr.Close()
		_, _ = io.Copy(out, pr)
	}()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := in.proc.Start(cmd); err != nil {
		pr.Close()
		return fmt.Errorf("start docker: %w", err)
	}
	return nil
}

// Accept implements provider.Instance.
func (in *Instance) Accept(ctx context.Context) (net.Conn, error) {
	if in.ln == nil {
		return nil, provider.ErrNotStarted
	}
	return provider.Accept(ctx, in.ln, in.proc.Done(), in.proc.Err)
}

// Done implements provider.Instance.
func (in *Instance) Done() <-chan struct{} { return in.proc.Done() }

// Err implements provider.Instance.
func (in *Instance) Err() error { return in.proc.Err() }

// Kill implements provider.Instance: docker kill, then the client.
func (in *Instance) Kill() error {
	return in.proc.KillAsking(func() {
		_, _ = output(context.Background(), in.docker, killArgs(in.cfg.Name)...)
	}, 5*time.Second)
}

// Destroy implements provider.Instance: kill, remove the container (--rm
// does not run when the client was killed), remove the state directory.
func (in *Instance) Destroy() error {
	err := in.Kill()
	if in.proc.Started() {
		if out, rerr := output(context.Background(), in.docker, removeArgs(in.cfg.Name)...); rerr != nil {
			if cerr := classify("remove container", out, rerr); !errors.Is(cerr, ErrNoContainer) {
				err = errors.Join(err, cerr)
			}
		}
	}
	in.release()
	return err
}

func (in *Instance) release() {
	if in.ln != nil {
		in.ln.Close()
		in.ln = nil
	}
	in.state.Release()
}
