package bench

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/internal/dockerd"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Hosted boot: oac-shim start to the ready event with the hosted
// bootstrap (identity, sandbox_io, the daemon with credentials and a
// health check; oac-sandbox-io and the daemon are the stand-in fixtures,
// installed with --sandbox-io and --install), per provider, beside the
// provider's bare runtime running /bin/true from the same image.

// hostedIdentity is the sandbox's identity; hostedBootstrap names it.
var hostedIdentity = []string{
	"--tenant", "0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21",
	"--environment", "1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32",
	"--allocation", "2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43",
}

const hostedDaemon = "/usr/local/bin/oac-daemon-standin"

// hostedSetup is what the hosted and warm rows boot with: a directory
// others can read holding the hosted bootstrap (its path: boot), the
// operator's flags that install the stand-ins, and its removal.
func hostedSetup(b Bins, prefix string) (dir, boot string, operator []string, cleanup func(), err error) {
	dir, cleanup, err = sharedTempDir(prefix)
	if err != nil {
		return "", "", nil, nil, err
	}
	if boot, err = hostedBootstrap(dir); err != nil {
		cleanup()
		return "", "", nil, nil, err
	}
	return dir, boot, []string{"--sandbox-io", b.SandboxIO, "--install", "oac-daemon-standin=" + b.Daemon}, cleanup, nil
}

// hostedBootstrap writes the hosted bootstrap into dir.
func hostedBootstrap(dir string) (string, error) {
	data, err := json.Marshal(hostedDoc())
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "hosted-bootstrap.json")
	return p, os.WriteFile(p, data, 0o600)
}

// hostedDoc is the hosted bootstrap document (the identity travels as
// hostedIdentity's flags; a claim carries it in the document's sandbox).
func hostedDoc() bootstrap.Bootstrap {
	return bootstrap.Bootstrap{
		Version: 1, Hostname: "bench",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://link.example.com/api/v1/sandbox-link", Credential: "bench-credential",
			Resource: bootstrap.Resource{TenantID: hostedIdentity[1], EnvironmentID: hostedIdentity[3], Kind: "allocation", ID: hostedIdentity[5], Generation: 1},
		}},
		Daemon:      &bootstrap.Process{Argv: []string{hostedDaemon, "serve", "--hostname", "127.0.0.1", "--port", "4096"}},
		Credentials: &bootstrap.Credentials{UsernameEnv: "OAC_SERVER_USERNAME", PasswordEnv: "OAC_SERVER_PASSWORD"},
		Health:      &bootstrap.Health{Port: 4096},
	}
}

// HostedFigures measures hosted boot to ready with bwrap, runc, crun and
// a Docker engine (the one that answers, else a private dockerd this run
// starts and stops), each beside its bare runtime.
func HostedFigures(r *Report, b Bins, runs int) error {
	if b.SandboxIO == "" || b.Daemon == "" {
		r.Skip("hosted boot figures", "need the stand-in fixtures (make fixtures: bin/fixtures/)")
		return nil
	}
	dir, boot, operator, cleanup, err := hostedSetup(b, "oac-bench-hosted-")
	if err != nil {
		return err
	}
	defer cleanup()
	args := append(append([]string{"--bootstrap", boot}, operator...), hostedIdentity...)
	hosted := func(provider ...string) func() (float64, error) {
		return shimToReady(b, 60*time.Second, append(provider, args...)...)
	}
	add := func(name, baseName string, bare, shim func() (float64, error)) error {
		base, subj, err := Pair(runs, bare, shim)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.Add(NewResult(name, "ms", subj, baseName, base))
		return nil
	}

	if _, err := exec.LookPath("bwrap"); err != nil {
		r.Skip("hosted boot with bwrap", "bubblewrap is not installed")
	} else if err := add("hosted boot, bwrap: oac-shim start to ready", "bare bwrap running /bin/true", bareBwrap, hosted("--provider", "bwrap")); err != nil {
		return err
	}
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.Skip("hosted boot with "+rt, rt+" is not installed")
			continue
		}
		rtDir := filepath.Join(dir, rt)
		if err := os.Mkdir(rtDir, 0o755); err != nil {
			return err
		}
		bare, err := bareRuntime(rt, rtDir)
		if err != nil {
			return err
		}
		if err := add("hosted boot, oci "+rt+": oac-shim start to ready", rt+" running /bin/true", bare, hosted("--provider", "oci", "--runtime", rt)); err != nil {
			return err
		}
	}
	if missing := dockerd.Missing(); missing != "" {
		r.Skip("hosted boot with docker", missing)
		return nil
	}
	return dockerHosted(r, b, dir, runs, add, hosted)
}

// dockerHosted measures the docker provider on an image oac-image builds
// from a base holding only /bin/true and the libraries it loads.
func dockerHosted(r *Report, b Bins, dir string, runs int, add func(string, string, func() (float64, error), func() (float64, error)) error,
	hosted func(...string) func() (float64, error)) error {
	ctx := context.Background()
	e, ref, done, err := dockerBench(ctx, b, dir, []imagebuild.ExtraFile{{Src: b.Daemon, Dst: hostedDaemon, Mode: 0o755}})
	if err != nil {
		var nd noDocker
		if errors.As(err, &nd) {
			r.Skip("hosted boot with docker", err.Error())
			return nil
		}
		return err
	}
	defer done()
	bare := func() (float64, error) {
		t := time.Now()
		if out, err := exec.Command(e.Client, "run", "--rm", "--network", "none", ref, "/bin/true").CombinedOutput(); err != nil {
			return 0, fmt.Errorf("docker run /bin/true: %v: %s", err, out)
		}
		return ms(time.Since(t)), nil
	}
	return add("hosted boot, docker: oac-shim start to ready", "docker run --rm --network none IMAGE /bin/true", bare,
		hosted("--provider", "docker", "--docker-image", ref))
}

// noDocker: no Docker engine could be started here.
type noDocker struct{ error }

// dockerBench starts a Docker engine (the one that answers, else a private
// dockerd) and imports an image oac-image builds under dir from a base
// holding only /bin/true (trueBase), with the agent, sandbox_io (the
// stand-in fixture, else the agent) and files; it points this process's
// Docker environment, which the shims it runs inherit, at the engine.
// done undoes all of it.
func dockerBench(ctx context.Context, b Bins, dir string, files []imagebuild.ExtraFile) (e *dockerd.Engine, ref string, done func(), err error) {
	e, err = dockerd.Start(ctx)
	if err != nil {
		return nil, "", nil, noDocker{err}
	}
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, func() { _ = e.Stop() })
	defer func() {
		if err != nil {
			done()
		}
	}()
	base := filepath.Join(dir, "base")
	if err := trueBase(base); err != nil {
		return nil, "", nil, fmt.Errorf("docker image base: %w", err)
	}
	sandboxIO := b.SandboxIO
	if sandboxIO == "" {
		sandboxIO = b.Guest
	}
	out := filepath.Join(dir, "image")
	if _, err := imagebuild.Build(imagebuild.Spec{Base: base, Injection: imagebuild.Injection{Agent: b.Guest, SandboxIO: sandboxIO, Files: files},
		Outputs: []string{imagebuild.OutTar}, Out: out, Epoch: 1}); err != nil {
		return nil, "", nil, fmt.Errorf("docker image: %w", err)
	}
	ref = fmt.Sprintf("oac-bench/guest:%d", os.Getpid())
	if _, err := e.Import(ctx, filepath.Join(out, imagebuild.TarName), ref); err != nil {
		return nil, "", nil, err
	}
	undo = append(undo, func() { _, _ = e.Docker(ctx, "image", "rm", "--force", ref) })
	for _, kv := range e.Env() {
		k, v, _ := strings.Cut(kv, "=")
		old, had := os.LookupEnv(k)
		os.Setenv(k, v)
		if had {
			undo = append(undo, func() { os.Setenv(k, old) })
		} else {
			undo = append(undo, func() { os.Unsetenv(k) })
		}
	}
	return e, ref, done, nil
}

// trueBase makes a base root filesystem with /bin/true and the shared
// libraries it loads (its ELF interpreter and DT_NEEDED entries, found
// with the interpreter's --list).
func trueBase(dir string) error {
	src, err := filepath.EvalSymlinks("/bin/true")
	if err != nil {
		return err
	}
	files := []string{src}
	f, err := elf.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return err
			}
			interp := strings.TrimRight(string(b), "\x00")
			files = append(files, interp)
			out, err := exec.Command(interp, "--list", src).Output()
			if err != nil {
				return fmt.Errorf("%s --list %s: %w", interp, src, err)
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				for _, field := range strings.Fields(sc.Text()) {
					if strings.HasPrefix(field, "/") {
						files = append(files, field)
					}
				}
			}
		}
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, p)
		if p == src {
			dst = filepath.Join(dir, "bin", "true")
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			return err
		}
	}
	return nil
}
