package bootstrap

import (
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Core is Core's sandbox.Bootstrap in the form oac-shim accepts it (oac-shim
// run --bootstrap-format core): the Runtime the sandbox runs and the
// SandboxIO input. FromCore and ToCore map it to and from a Bootstrap,
// field by field (docs/schema.md, "Core's bootstrap"); this file is the only
// place that knows Core's shape.
type Core struct {
	Runtime *CoreRuntime `json:"runtime,omitempty"`
	// SandboxIO is oac-sandbox-io's input, exactly the private file's
	// content.
	SandboxIO *SandboxIO `json:"sandbox_io,omitempty"`
}

// CoreRuntime is the daemon's boot contract as Core carries it.
type CoreRuntime struct {
	// Command is the daemon's serve command, argv[0] an absolute path.
	Command []string `json:"command"`
	// Env is the daemon's environment by name.
	Env map[string]string `json:"env,omitempty"`
	// WorkDir is the daemon's working directory.
	WorkDir  string `json:"workdir,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	// Port is where the daemon serves; given, its health is polled there.
	Port       int    `json:"port,omitempty"`
	HealthPath string `json:"health_path,omitempty"`
	// Username and Password are the daemon's Basic credentials (an empty
	// password: oac-shim generates one), handed to it in UsernameEnv and
	// PasswordEnv.
	Username    string `json:"username,omitempty"`
	Password    string `json:"password,omitempty"`
	UsernameEnv string `json:"username_env,omitempty"`
	PasswordEnv string `json:"password_env,omitempty"`
	// StopGraceMS is SIGTERM to SIGKILL in milliseconds.
	StopGraceMS int64 `json:"stop_grace_ms,omitempty"`
}

// ErrNotCore is returned by ToCore for a Bootstrap Core's shape cannot
// carry.
var ErrNotCore = rule("bootstrap: Core's shape cannot carry this bootstrap")

// DecodeCore reads Core's shape as strictly as Decode reads a Bootstrap
// (at most MaxSize, exact keys, none twice, no trailing data) and maps it
// with FromCore. It does not validate; call Validate.
func DecodeCore(r io.Reader) (*Bootstrap, error) {
	var c Core
	if err := decodeStrict(r, coreSchema, &c); err != nil {
		return nil, err
	}
	return FromCore(&c)
}

// FromCore maps Core's shape to a Bootstrap:
//
//	runtime.command        daemon.argv
//	runtime.env            daemon.env (NAME=VALUE, sorted by NAME)
//	runtime.workdir        daemon.dir
//	runtime.hostname       hostname
//	runtime.port           health.port (with credentials: the health check)
//	runtime.health_path    health.path
//	runtime.username ...   credentials (present when username_env or password_env is)
//	runtime.stop_grace_ms  stop_grace
//	sandbox_io             sandbox_io.bootstrap (path: the image's oac-sandbox-io)
//
// A port without credentials is refused (the health check needs them).
func FromCore(c *Core) (*Bootstrap, error) {
	b := &Bootstrap{Version: Version}
	if c.SandboxIO != nil {
		s := *c.SandboxIO
		b.SandboxIO = &SandboxIOSpec{Bootstrap: &s}
	}
	r := c.Runtime
	if r == nil {
		return b, nil
	}
	b.Hostname = r.Hostname
	if len(r.Command) > 0 || len(r.Env) > 0 || r.WorkDir != "" {
		p := &Process{Argv: slices.Clone(r.Command), Dir: r.WorkDir}
		for _, k := range slices.Sorted(maps.Keys(r.Env)) {
			p.Env = append(p.Env, k+"="+r.Env[k])
		}
		b.Daemon = p
	}
	if r.Username != "" || r.Password != "" || r.UsernameEnv != "" || r.PasswordEnv != "" {
		b.Credentials = &Credentials{Username: r.Username, Password: r.Password, UsernameEnv: r.UsernameEnv, PasswordEnv: r.PasswordEnv}
	}
	if r.Port != 0 || r.HealthPath != "" {
		if b.Credentials == nil {
			return nil, ErrHealthNeedsCredentials
		}
		b.Health = &Health{Port: r.Port, Path: r.HealthPath}
	}
	if r.StopGraceMS < 0 || r.StopGraceMS > int64(MaxStopGrace/time.Millisecond) {
		// Before the conversion, which would wrap a huge value into a
		// short grace that validates.
		return nil, ErrStopGrace
	}
	if r.StopGraceMS != 0 {
		d := Duration(time.Duration(r.StopGraceMS) * time.Millisecond)
		b.StopGrace = &d
	}
	return b, nil
}

// ToCore maps a Bootstrap to Core's shape, the inverse of FromCore. It
// returns ErrNotCore (naming what) for what Core's shape has no field for:
// the sandbox identity (the host's flags give it), a provided private file
// or another oac-sandbox-io path, health timings other than the defaults,
// a daemon env entry whose name repeats.
func ToCore(b *Bootstrap) (*Core, error) {
	notCore := func(what string) error { return fmt.Errorf("%w: %s", ErrNotCore, what) }
	c := &Core{}
	if b.Sandbox != nil {
		return nil, notCore("the sandbox identity (give it with --tenant, --environment, --allocation)")
	}
	if s := b.SandboxIO; s != nil {
		if s.Provided || s.Bootstrap == nil || (s.Path != "" && s.Path != SandboxIOPath) {
			return nil, notCore("sandbox_io other than a bootstrap for the image's oac-sandbox-io")
		}
		sio := *s.Bootstrap
		c.SandboxIO = &sio
	}
	r := &CoreRuntime{Hostname: b.Hostname}
	if p := b.Daemon; p != nil {
		r.Command, r.WorkDir = slices.Clone(p.Argv), p.Dir
		for _, kv := range p.Env {
			k, v, _ := strings.Cut(kv, "=")
			if r.Env == nil {
				r.Env = map[string]string{}
			}
			if _, dup := r.Env[k]; dup {
				return nil, notCore("daemon.env names a variable twice")
			}
			r.Env[k] = v
		}
	}
	if cr := b.Credentials; cr != nil {
		r.Username, r.Password, r.UsernameEnv, r.PasswordEnv = cr.Username, cr.Password, cr.UsernameEnv, cr.PasswordEnv
	}
	if h := b.Health; h != nil {
		if h.Interval != nil || h.Timeout != nil || h.Deadline != nil {
			return nil, notCore("health interval, timeout or deadline")
		}
		r.Port, r.HealthPath = h.Port, h.Path
	}
	if b.StopGrace != nil {
		r.StopGraceMS = time.Duration(*b.StopGrace).Milliseconds()
	}
	if !reflect.DeepEqual(*r, CoreRuntime{}) {
		c.Runtime = r
	}
	return c, nil
}
