package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"regexp"
	"slices"
	"sync"
)

// Sentinel errors; providers wrap them with context.
var (
	// ErrUnavailable: the provider cannot run on this host (missing binary,
	// kernel feature, privilege). The wrapping message says what to install
	// or change.
	ErrUnavailable = errors.New("provider unavailable")
	// ErrExists: a sandbox of that name is already running.
	ErrExists = errors.New("sandbox already exists")
	// ErrInvalidSpec: the Spec breaks a rule; nothing was created.
	ErrInvalidSpec = errors.New("invalid sandbox spec")
	// ErrNotStarted: the operation needs a started instance.
	ErrNotStarted = errors.New("sandbox not started")
)

// Spec describes one sandbox to create.
type Spec struct {
	// Name identifies the sandbox on this host; see ValidName.
	Name string
	// AgentPath is the host path of the oac-guest binary to run as PID 1.
	AgentPath string
	// Rootfs is a host directory used as the guest's read-only root; empty
	// selects the provider's default.
	Rootfs string
	// Hostname is written into the guest's /etc/hosts when the provider
	// supplies it.
	Hostname string
	// Stderr receives the runtime's diagnostics and the agent's own log.
	Stderr io.Writer
	// SandboxIOPath, when set, is a host binary the provider installs
	// read-only as /usr/local/bin/oac-sandbox-io (guest images have the
	// real one; this is for the default root, development and tests).
	SandboxIOPath string
	// Install maps names to host binaries installed read-only as
	// /usr/local/bin/NAME, for the same purposes.
	Install map[string]string
	// Volumes maps a guest runtime directory (one of VolumeDirs) to a host
	// directory bound read-write in its place (a persistent volume, as
	// hosted containers have); without one the provider gives a fresh
	// tmpfs. The guest's root must be able to write it.
	Volumes map[string]string
	// Keep, when set, makes the sandbox a kept one: everything it writes
	// (its root's writable layer or disk overlay, /home, /environment)
	// lives under Keep.Dir or in a runtime object named after the sandbox
	// (a Docker container or volume, a registered WSL distribution), and
	// outlives the Instance: Destroy stops the runtime and removes what
	// one run made, never the kept state. Keeper.Discard removes that.
	// Nil is a throwaway sandbox, as `oac-shim run` makes.
	Keep *Keep
}

// Keep says where a kept sandbox's state lives on the host.
type Keep struct {
	// Dir is a private (0700) directory the shim made for this sandbox
	// under its state root. The provider owns what it puts inside; on the
	// first Create it is empty, on later ones it holds what the earlier
	// runs left.
	Dir string
}

// Keeper is implemented by providers that can keep a sandbox across runs
// (Spec.Keep). The shim refuses `oac-shim create` for providers without
// it, before anything is made.
type Keeper interface {
	// Discard removes every byte kept for the sandbox name: what the
	// provider put under dir and anything it keeps elsewhere. It is safe
	// on a partly made sandbox (a create killed half way) and on one
	// already discarded, and it never touches anything not made for name.
	Discard(ctx context.Context, name, dir string) error
}

// The layout every provider gives a kept sandbox (Spec.Keep): the guest's
// /home, /environment and /usr/local are what survive stop and start and
// what Keeper.Discard removes. /usr/local belongs to the workload (guest
// uid 1000) in a kept sandbox: what it installs there (npm -g, pip
// --prefix /usr/local, a downloaded tool) is the sandbox's installed
// packages. /usr/local/bin and /usr/local/sbin stay guest root's (the
// workload cannot replace a binary the agent runs from there, such as
// oac-sandbox-io); the shim's own installs (Spec.Installs) are bound
// read-only over their files in /usr/local/bin, as in a throwaway
// sandbox. The conformance suite checks a file uid 1000 writes under
// /usr/local/lib. A
// provider that keeps the whole root (a disk overlay, a container, a WSL
// distribution) keeps these with it and hands /usr/local to uid 1000 the
// first time.
var KeptDirs = []string{"/home", "/environment", "/usr/local"}

// ImageNamer is implemented by providers that boot an image of their own
// (a kernel and initramfs, a disk, a Docker image) instead of, or besides,
// Spec.Rootfs. ImageOf names it for a kept sandbox's record (ref) and
// identifies its content (digest, "sha256:HEX", "" when it cannot tell),
// so that a later start can say the image changed since create. Without
// it the shim names Spec.Rootfs, or the provider's default root.
type ImageNamer interface {
	ImageOf(ctx context.Context, spec Spec) (ref, digest string, err error)
}

// ImageChecker is implemented by instances of providers that keep
// sandboxes. ImageChanged returns, for a kept sandbox whose image changed
// since it was created, a sentence saying so (the sandbox keeps running
// the image it was created from until it is reset), and "" otherwise.
type ImageChecker interface {
	ImageChanged() string
}

// VolumeDirs are the guest directories Spec.Volumes may name.
var VolumeDirs = []string{"/home", "/environment"}

// SandboxIOName is the file name oac-sandbox-io is installed under.
const SandboxIOName = "oac-sandbox-io"

// Installs returns every binary to install, SandboxIOPath included, as
// name -> host path.
func (s Spec) Installs() map[string]string {
	m := make(map[string]string, len(s.Install)+1)
	for k, v := range s.Install {
		m[k] = v
	}
	if s.SandboxIOPath != "" {
		m[SandboxIOName] = s.SandboxIOPath
	}
	return m
}

// InstallNames returns the names of Installs, sorted: the order
// providers mount them in.
func (s Spec) InstallNames() []string {
	return slices.Sorted(maps.Keys(s.Installs()))
}

// The patterns are compiled on first use, not when oac-shim starts.
var installNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`) })

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

// ValidName reports whether name is a valid sandbox name: 1 to 63 of a-z,
// 0-9 and '-', not starting with '-'. Names become host paths, so nothing
// else is accepted.
func ValidName(name string) bool { return nameRE().MatchString(name) }

// Validate checks the fields every provider relies on.
func (s Spec) Validate() error {
	if !ValidName(s.Name) {
		return fmt.Errorf("%w: name must be 1 to 63 characters of a-z, 0-9 and '-', not starting with '-'", ErrInvalidSpec)
	}
	if s.AgentPath == "" {
		return fmt.Errorf("%w: no oac-guest binary given", ErrInvalidSpec)
	}
	for dir, host := range s.Volumes {
		if dir != VolumeDirs[0] && dir != VolumeDirs[1] {
			return fmt.Errorf("%w: a volume can replace only /home or /environment", ErrInvalidSpec)
		}
		if host == "" {
			return fmt.Errorf("%w: volume %s: no host directory given", ErrInvalidSpec, dir)
		}
	}
	for name, path := range s.Install {
		if !installNameRE().MatchString(name) {
			return fmt.Errorf("%w: an install name must be 1 to 63 characters of A-Z, a-z, 0-9, '.', '_' and '-'", ErrInvalidSpec)
		}
		if name == SandboxIOName && s.SandboxIOPath != "" {
			return fmt.Errorf("%w: %s is installed twice (--sandbox-io and --install)", ErrInvalidSpec, SandboxIOName)
		}
		if path == "" {
			return fmt.Errorf("%w: install %s: no host path given", ErrInvalidSpec, name)
		}
	}
	return nil
}

// Provider boots guests of one kind.
type Provider interface {
	// Name is the provider's name as given to --provider.
	Name() string
	// Capabilities are its fixed facts (see Capabilities).
	Capabilities() Capabilities
	// Check returns nil when the provider can run here, or an error
	// wrapping ErrUnavailable that says why and what to do.
	Check(ctx context.Context) error
	// Create prepares a sandbox (state, transport listener) without
	// starting it. On error nothing is left behind. spec has passed
	// Validate: the sandbox checks it once, before anything is created.
	Create(ctx context.Context, spec Spec) (Instance, error)
}

// Instance is one created sandbox.
type Instance interface {
	// Start starts the runtime. The guest connects on its own.
	Start(ctx context.Context) error
	// Accept returns the guest's transport connection.
	Accept(ctx context.Context) (net.Conn, error)
	// Done is closed when the runtime has exited; Err then says why.
	Done() <-chan struct{}
	Err() error
	// Kill stops the runtime at once and waits for it to exit.
	Kill() error
	// Destroy removes everything Create made. It kills a running runtime
	// first and is safe to call more than once.
	Destroy() error
}

// DataPlane is implemented by instances whose guest can carry connections
// beside the session (see package host/dataplane). DataCarriers lists
// what the transport allows: protocol.CapDataFD (the guest shares this
// kernel and its transport is a unix socket: descriptors can be passed),
// protocol.CapDataDial (the guest can dial the transport's listener once
// per connection, which Accept then returns), or nothing.
type DataPlane interface {
	DataCarriers() []string
}

// Detailer is implemented by providers that can say how sandboxes would
// run here (after a nil Check); oac-shim check prints it.
type Detailer interface {
	Detail(ctx context.Context) string
}

// Resetter is implemented by providers that can leave something of a
// sandbox on the host after its runtime is gone (a WSL distribution whose
// unregister failed). Reset removes what a sandbox of that name left; the
// control API's reset calls it between the stop and the fresh start.
type Resetter interface {
	Reset(ctx context.Context, name string) error
}

// Unavailable is a provider that cannot run on this OS: Check and Create
// fail with ErrUnavailable and why.
func Unavailable(name, why string) Provider { return unavailable{name, why} }

type unavailable struct{ name, why string }

func (u unavailable) Name() string               { return u.name }
func (u unavailable) Capabilities() Capabilities { return Capabilities{} }
func (u unavailable) Check(context.Context) error {
	return fmt.Errorf("%w: %s: %s", ErrUnavailable, u.name, u.why)
}
func (u unavailable) Create(ctx context.Context, _ Spec) (Instance, error) {
	return nil, u.Check(ctx)
}
