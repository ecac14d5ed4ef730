package dockerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/hostclean"
)

// DefaultHost is the engine's default socket.
const DefaultHost = "unix:///var/run/docker.sock"

// startTimeout bounds how long a private dockerd may take to answer.
const startTimeout = 60 * time.Second

// Engine is a reachable Docker engine.
type Engine struct {
	// Host is the engine's DOCKER_HOST.
	Host string
	// Client is the docker client used to talk to it.
	Client string
	// Started reports whether Start started this engine (Stop ends it).
	Started bool

	dir, cgroup string
	cmd         *exec.Cmd
	done        chan struct{}
	log         *os.File
	ifaces      []string
	chains      []string
	stopOnce    sync.Once
	stopErr     error
}

// Missing says what to install when the engine cannot run here ("" when
// the client and dockerd are installed).
func Missing() string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "the docker client is not installed: apt-get install docker.io (or run make deps)"
	}
	if _, err := exec.LookPath("dockerd"); err != nil && os.Getenv("DOCKER_HOST") == "" {
		return "dockerd is not installed: apt-get install docker.io (or run make deps)"
	}
	return ""
}

// Start returns the engine at DOCKER_HOST or the default socket when it
// answers, else starts a private one (root only).
func Start(ctx context.Context) (*Engine, error) {
	client, err := exec.LookPath("docker")
	if err != nil {
		return nil, errors.New(Missing())
	}
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = DefaultHost
	}
	e := &Engine{Host: host, Client: client}
	if _, err := e.Docker(ctx, "version", "--format", "{{.Server.Version}}"); err == nil {
		return e, nil
	} else if os.Getenv("DOCKER_HOST") != "" {
		return nil, fmt.Errorf("the engine at DOCKER_HOST=%s does not answer: %w", host, err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("no Docker engine answers and only root can start one: start dockerd, or run as root")
	}
	if err := e.start(ctx); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// Env returns the environment a docker client needs to reach the engine.
func (e *Engine) Env() []string { return []string{"DOCKER_HOST=" + e.Host} }

// Docker runs the client against the engine and returns its output
// (stdout and stderr), trimmed.
func (e *Engine) Docker(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Client, args...)
	cmd.Env = append(os.Environ(), e.Env()...)
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// Import makes the image ref from a rootfs tarball (oac-image build's
// rootfs.tar.gz) and returns its id.
func (e *Engine) Import(ctx context.Context, tarball, ref string) (string, error) {
	if _, err := e.Docker(ctx, "import", tarball, ref); err != nil {
		return "", err
	}
	return e.Docker(ctx, "image", "inspect", "--format", "{{.Id}}", ref)
}

// Layers returns the storage directories the engine holds (one per image
// layer and per container layer), sorted: for a private engine the
// entries of its vfs store, else nil.
func (e *Engine) Layers() ([]string, error) {
	if !e.Started {
		return nil, nil
	}
	ents, err := os.ReadDir(filepath.Join(e.dir, "data", "vfs", "dir"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	slices.Sort(out)
	return out, nil
}

// ContainerLayers lists the vfs layers the engine's containers use (each
// container's read-write layer and its init layer, from the layer
// store's mounts), for a test's leftover check.
func (e *Engine) ContainerLayers() ([]string, error) {
	if !e.Started {
		return nil, nil
	}
	mounts := filepath.Join(e.dir, "data", "image", "vfs", "layerdb", "mounts")
	ents, err := os.ReadDir(mounts)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []string
	for _, en := range ents {
		for _, f := range []string{"mount-id", "init-id"} {
			if b, err := os.ReadFile(filepath.Join(mounts, en.Name(), f)); err == nil {
				out = append(out, strings.TrimSpace(string(b)))
			}
		}
	}
	return out, nil
}

func (e *Engine) start(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "oac-dockerd-")
	if err != nil {
		return err
	}
	e.dir = dir
	e.Started = true
	e.Host = "unix://" + filepath.Join(dir, "docker.sock")
	e.cgroup = "/" + filepath.Base(dir)
	e.ifaces = hostclean.Interfaces()
	e.chains = hostclean.Chains(iptablesTables...)
	cfg := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(cfg, []byte("{}\n"), 0o600); err != nil {
		return err
	}
	if e.log, err = os.Create(filepath.Join(dir, "dockerd.log")); err != nil {
		return err
	}
	ns := filepath.Base(dir)
	e.cmd = exec.Command("dockerd",
		"--config-file", cfg,
		"--storage-driver", "vfs",
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "dockerd.pid"),
		"--host", e.Host,
		"--containerd-namespace", ns,
		"--containerd-plugins-namespace", ns+"-plugins",
		"--cgroup-parent", e.cgroup,
		"--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--userland-proxy=false", "--log-level", "warn",
	)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.Dir = "/"
	// Its own process group: a signal to the caller's group does not
	// reach it; it dies with the caller (a killed test run).
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	e.done = make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		if _, err := e.Docker(ctx, "version", "--format", "{{.Server.Version}}"); err == nil {
			return nil
		}
		select {
		case <-e.done:
			return fmt.Errorf("dockerd exited at start: %s", e.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dockerd did not answer within %s: %s", startTimeout, e.logTail())
		}
	}
}

func (e *Engine) logTail() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "dockerd.log"))
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// Stop ends an engine Start started (nothing for one it found) and
// removes what it left: its directory, mounts under it, its cgroup parent,
// and interfaces and iptables chains named like docker's that appeared.
func (e *Engine) Stop() error {
	if !e.Started {
		return nil
	}
	e.stopOnce.Do(func() { e.stopErr = e.stop() })
	return e.stopErr
}

func (e *Engine) stop() error {
	var errs []error
	if e.cmd != nil && e.cmd.Process != nil {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(20 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.done
			errs = append(errs, errors.New("dockerd did not stop within 20s of SIGTERM; killed"))
		}
	}
	if e.log != nil {
		e.log.Close()
	}
	for _, name := range hostclean.Interfaces() {
		if !slices.Contains(e.ifaces, name) && (name == "docker0" || strings.HasPrefix(name, "br-") || strings.HasPrefix(name, "veth")) {
			if out, err := exec.Command("ip", "link", "delete", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("remove interface %s: %v: %s", name, err, out))
			}
		}
	}
	for _, c := range hostclean.Chains(iptablesTables...) {
		if !slices.Contains(e.chains, c) && strings.HasPrefix(strings.SplitN(c, " ", 2)[1], "DOCKER") {
			table, chain, _ := strings.Cut(c, " ")
			_ = exec.Command("iptables", "-t", table, "-F", chain).Run()
			if out, err := exec.Command("iptables", "-t", table, "-X", chain).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("remove iptables chain %s: %v: %s", c, err, out))
			}
		}
	}
	if e.dir != "" {
		hostclean.UnmountUnder(e.dir)
		if err := os.RemoveAll(e.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if e.cgroup != "" {
		removeCgroup(e.cgroup)
	}
	return errors.Join(errs...)
}

// iptablesTables are the tables dockerd adds chains to.
var iptablesTables = []string{"filter", "nat"}

// removeCgroup removes the cgroup parent from every hierarchy (it is
// empty once the engine's containers are gone).
func removeCgroup(parent string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		p := filepath.Join(r, parent)
		// Children first (none are expected).
		subs, _ := filepath.Glob(filepath.Join(p, "*"))
		for _, s := range subs {
			if st, err := os.Stat(s); err == nil && st.IsDir() {
				_ = unix.Rmdir(s)
			}
		}
		_ = unix.Rmdir(p)
	}
}

// Cgroups returns the cgroup directories of the engine's parent that
// exist (for leftover checks: one per running container).
func (e *Engine) Cgroups() []string {
	if e.cgroup == "" {
		return nil
	}
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		subs, _ := filepath.Glob(filepath.Join(r, e.cgroup, "*"))
		for _, s := range subs {
			if st, err := os.Stat(s); err == nil && st.IsDir() {
				out = append(out, s)
			}
		}
	}
	return out
}

// LogTail is the end of a private engine's log (for test failures).
func (e *Engine) LogTail() string {
	if !e.Started {
		return ""
	}
	return e.logTail()
}
