package client

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// Options say how to launch oac-shim. The typed fields become flags of
// `oac-shim run` (or `start` with Kept); Args come last, for any flag
// without a field.
type Options struct {
	// Shim is the oac-shim binary (default: $OAC_SHIM, else oac-shim in PATH).
	Shim string
	// Name is the sandbox's name (--name).
	Name string
	// Kept starts the kept sandbox of this name (`oac-shim start`, made
	// with CreateKept) instead of a throwaway one (`oac-shim run`). Its
	// provider and installs come from its record: Provider, SandboxIO and
	// Install are refused with it.
	Kept bool
	// KeepRoot is --keep-root (default: the shim's).
	KeepRoot string
	// Provider is --provider (default: the shim's, bwrap).
	Provider string
	// Agent is the oac-guest binary (--agent; default: beside oac-shim).
	Agent string
	// SandboxIO and Install put host binaries in the guest's
	// /usr/local/bin (--sandbox-io, --install NAME=PATH).
	SandboxIO string
	Install   []string
	// Bootstrap is read whole (at most 256 KiB) and handed to the shim on
	// its stdin (--bootstrap -): it touches no disk. CoreBootstrap says
	// it is Core's {runtime, sandbox_io} (--bootstrap-format core).
	Bootstrap     io.Reader
	CoreBootstrap bool
	// Password is the daemon's password, handed to the shim as the first
	// line of its stdin (--password-stdin, with Bootstrap): never in argv,
	// environment or a file. Empty: one is generated with crypto/rand
	// (Shim.Password returns it). Every attempt (restart, reset) uses it.
	// A bootstrap that names a password itself is refused by the shim:
	// give it here instead.
	Password string
	// Identity makes a hosted sandbox (--tenant, --environment,
	// --allocation): the bootstrap's resource must name them.
	Identity *Identity
	// Forwards are --forward LISTEN=GUESTPORT, e.g. "127.0.0.1:0=4096".
	Forwards []string
	// Allow are egress rules (--allow) and Upstreams named upstreams
	// (--upstream NAME:PORT=ADDR).
	Allow     []string
	Upstreams []string
	// BootTimeout and Timeout are --boot-timeout and --timeout (0: the
	// shim's defaults).
	BootTimeout time.Duration
	Timeout     time.Duration
	// Outlive lets the sandbox outlive this process (--outlive-parent):
	// the end of the shim's stdin no longer stops it, its events are kept
	// in a bounded journal, and Attach reaches it again by name, events
	// and control API. Stop it with Stop (of this Shim or an attached
	// one), StopNamed or StopAll.
	Outlive bool
	// History is how many events the Shim keeps for Events, WaitEvent and
	// History (default 1024): the oldest are dropped first.
	History int
	// Args are more flags, appended after the typed ones.
	Args []string
	// Env is the shim's environment (nil: this process's).
	Env []string
	// Stderr receives the shim's diagnostics (nil: discarded; the last
	// lines are kept for the errors either way).
	Stderr io.Writer
	// OnEvent, when set, sees every event in order (not answers). It runs
	// on the reader goroutine and must not block.
	OnEvent func(api.Event)
}

// Identity is a hosted sandbox's own identity.
type Identity struct {
	Tenant, Environment, Allocation string
	// AllowLoopbackLink accepts ws:// or wss:// on a loopback host
	// (development only).
	AllowLoopbackLink bool
}

// DefaultHistory is how many events a Shim keeps when Options.History is 0.
const DefaultHistory = 1024

// maxBootstrap is the shim's bound on a bootstrap (bootstrap.MaxSize).
const maxBootstrap = 256 << 10

// args returns the shim's argv after the binary.
func (o *Options) args() ([]string, error) {
	if o.Name == "" {
		return nil, errors.New("client: a sandbox name is required (Options.Name)")
	}
	cmd := "run"
	if o.Kept {
		cmd = "start"
		if o.Provider != "" || o.SandboxIO != "" || len(o.Install) > 0 {
			return nil, errors.New("client: a kept sandbox has its provider and installs from CreateKept: leave Provider, SandboxIO and Install empty")
		}
	}
	a := []string{cmd, "--name", o.Name, "--control", "stdin"}
	if o.Bootstrap != nil {
		a = append(a, "--password-stdin")
	} else if o.Password != "" {
		return nil, errors.New("client: Options.Password goes with Options.Bootstrap: the password is the daemon's, whose credentials the bootstrap names")
	}
	add := func(flag, v string) {
		if v != "" {
			a = append(a, flag, v)
		}
	}
	add("--keep-root", o.KeepRoot)
	add("--provider", o.Provider)
	add("--agent", o.Agent)
	add("--sandbox-io", o.SandboxIO)
	for _, v := range o.Install {
		a = append(a, "--install", v)
	}
	if o.Bootstrap != nil {
		a = append(a, "--bootstrap", "-")
		if o.CoreBootstrap {
			a = append(a, "--bootstrap-format", "core")
		}
	}
	if id := o.Identity; id != nil {
		a = append(a, "--tenant", id.Tenant, "--environment", id.Environment, "--allocation", id.Allocation)
		if id.AllowLoopbackLink {
			a = append(a, "--allow-loopback-link")
		}
	}
	for _, v := range o.Forwards {
		a = append(a, "--forward", v)
	}
	for _, v := range o.Allow {
		a = append(a, "--allow", v)
	}
	for _, v := range o.Upstreams {
		a = append(a, "--upstream", v)
	}
	if o.BootTimeout > 0 {
		a = append(a, "--boot-timeout", o.BootTimeout.String())
	}
	if o.Timeout > 0 {
		a = append(a, "--timeout", o.Timeout.String())
	}
	if o.Outlive {
		a = append(a, "--outlive-parent")
	}
	return append(a, o.Args...), nil
}

// stdinPrelude is what the shim reads first on stdin: the password line,
// then the bootstrap. The caller's reader is read here, before anything
// is launched, so a reader that fails or is too long starts nothing.
func (o *Options) stdinPrelude() (prelude []byte, password string, err error) {
	if o.Bootstrap == nil {
		return nil, "", nil
	}
	password = o.Password
	if password == "" {
		password = NewPassword()
	} else if err := checkPassword(password); err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(io.LimitReader(o.Bootstrap, maxBootstrap+1))
	if err != nil {
		return nil, "", fmt.Errorf("client: read the bootstrap: %w", err)
	}
	if len(b) > maxBootstrap {
		return nil, "", fmt.Errorf("client: the bootstrap is over %d KiB, the shim's bound: make it smaller", maxBootstrap>>10)
	}
	prelude = append([]byte(password), '\n')
	prelude = append(append(prelude, b...), '\n')
	return prelude, password, nil
}

// NewPassword returns a fresh daemon password: 32 bytes of crypto/rand,
// base64url (43 printable characters).
func NewPassword() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// checkPassword says what is wrong with a caller's password, without
// repeating it: the bootstrap's rule, 16 to 1024 printable ASCII.
func checkPassword(p string) error {
	if len(p) < 16 || len(p) > 1024 {
		return errors.New("client: Options.Password must be 16 to 1024 printable ASCII characters (length " + strconv.Itoa(len(p)) + "); leave it empty to have one generated")
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x21 || p[i] > 0x7e {
			return fmt.Errorf("client: Options.Password must be printable ASCII without spaces: byte %d is not; leave it empty to have one generated", i)
		}
	}
	return nil
}
