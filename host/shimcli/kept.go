package shimcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/oac/sandbox-agent/host/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
)

// Kept sandboxes: oac-shim create, start, reset, destroy and list act on
// the records of a persist.Store, each holding the sandbox's lock for as
// long as it acts (start: for as long as the sandbox runs).

// newStore opens the store of kept sandboxes (replaced in tests).
var newStore = func(root string) persist.Store {
	if root == "" {
		root = persist.DefaultRoot()
	}
	return persist.NewFileStore(provider.AbsPath(root))
}

// now is the clock of the records (replaced in tests).
var now = func() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// providerFlagNames are the flags the registered providers define.
func providerFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	provider.Declare(fs)
	names := map[string]bool{}
	fs.VisitAll(func(fl *flag.Flag) { names[fl.Name] = true })
	return names
}

// createFlagsGiven lists the create flags given on fs (oac-shim start
// refuses them: the record has them).
func createFlagsGiven(fs *flag.FlagSet) []string {
	prov := providerFlagNames()
	var given []string
	fs.Visit(func(fl *flag.Flag) {
		switch {
		case fl.Name == "provider", fl.Name == "rootfs", fl.Name == "sandbox-io", fl.Name == "install", fl.Name == "volume", prov[fl.Name]:
			given = append(given, "--"+fl.Name)
		}
	})
	return given
}

// recordedProviderFlags returns the provider flags given on fs, as the
// record keeps them.
func recordedProviderFlags(fs *flag.FlagSet) []string {
	prov := providerFlagNames()
	var out []string
	fs.Visit(func(fl *flag.Flag) {
		if prov[fl.Name] {
			out = append(out, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return out
}

// providerOf makes the record's provider with its recorded flags.
func providerOf(r persist.Record) (provider.Provider, error) {
	fs := flag.NewFlagSet("record", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ps := provider.Declare(fs)
	if err := fs.Parse(r.Flags.Provider); err != nil {
		return nil, fmt.Errorf("the record's provider flags %q: %w", r.Flags.Provider, err)
	}
	mk, ok := ps[r.Provider]
	if !ok {
		return nil, fmt.Errorf("the record names provider %q, which this oac-shim does not have (have %s)", r.Provider, strings.Join(provider.Names(), ", "))
	}
	return mk(), nil
}

// keeperOf returns p's Keeper, or an error saying p cannot keep.
func keeperOf(p provider.Provider) (provider.Keeper, error) {
	k, ok := p.(provider.Keeper)
	if !ok {
		return nil, failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: the %s provider cannot keep a sandbox (yet); use oac-shim run for a throwaway one", provider.ErrInvalidSpec, p.Name()))
	}
	return k, nil
}

// imageOf names the image a sandbox of spec boots (see
// provider.ImageNamer) for its record.
func imageOf(ctx context.Context, p provider.Provider, spec provider.Spec, providerFlags []string) (persist.Image, error) {
	if n, ok := p.(provider.ImageNamer); ok {
		ref, digest, err := n.ImageOf(ctx, spec)
		return persist.Image{Ref: ref, Digest: digest}, err
	}
	if spec.Rootfs == "" {
		if !slices.Contains(provider.Honours(p), provider.FeatureRootfs) && len(providerFlags) > 0 {
			// A provider that boots an image of its own names it in its
			// flags (the instance says when it changed: ImageChecker).
			return persist.Image{Ref: strings.Join(providerFlags, " ")}, nil
		}
		return persist.Image{Ref: "default root"}, nil
	}
	digest, err := persist.Digest(spec.Rootfs)
	return persist.Image{Ref: spec.Rootfs, Digest: digest}, err
}

// specOf is the provider.Spec a record's sandbox is created with.
func specOf(r persist.Record, agent string, dir string, stderr io.Writer) provider.Spec {
	return provider.Spec{
		Name: r.Name, AgentPath: agent, Rootfs: r.Flags.Rootfs, Stderr: stderr,
		SandboxIOPath: r.Flags.SandboxIO, Install: r.Flags.Install, Keep: &provider.Keep{Dir: dir},
	}
}

// keptOps are the operations on one store, reporting what they do to
// say (one line each, for stderr or a kept event).
type keptOps struct {
	store persist.Store
	say   func(string)
}

// discard removes every byte kept for name: the provider's (the record's
// provider, or every provider that keeps when the record cannot be read)
// and the store's. The caller holds the lock.
func (o keptOps) discard(ctx context.Context, name string, rec *persist.Record) error {
	dir := o.store.Dir(name)
	var errs []error
	var ps []provider.Provider
	if rec != nil {
		if p, err := providerOf(*rec); err == nil {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		for _, mk := range provider.Declare(fs) {
			ps = append(ps, mk())
		}
	}
	for _, p := range ps {
		if k, ok := p.(provider.Keeper); ok {
			err := k.Discard(ctx, name, dir)
			switch {
			case err != nil && len(ps) > 1 && errors.Is(err, provider.ErrUnavailable):
				// Asked because the record could not say which provider
				// made it: one that cannot run here made nothing here
				// that it could remove now.
				o.say(fmt.Sprintf("%s kept nothing it can discard here: %v", p.Name(), err))
			case err != nil:
				errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			}
		}
	}
	if err := o.store.Remove(name); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("discard kept sandbox %s: %w", name, errors.Join(errs...))
	}
	return nil
}

// claim takes name's lock and loads its record. What a shim killed half
// way through a create or reset left (a record in an unfinished state, a
// directory without a record) is discarded first and said; found is then
// false. A record that cannot be read is returned as the error (with
// found true) for the caller to refuse or, for destroy, to remove.
func (o keptOps) claim(ctx context.Context, name string) (l persist.Unlocker, rec persist.Record, found bool, err error) {
	l, err = o.store.Lock(name)
	if err != nil {
		return nil, rec, false, err
	}
	rec, err = o.store.Load(name)
	switch {
	case errors.Is(err, persist.ErrNotFound):
		return l, rec, false, nil
	case err != nil:
		return l, rec, true, err
	case rec.State.Unfinished():
		o.say(fmt.Sprintf("discarded kept sandbox %s: a shim was killed while it was %s (state %q, no shim holds it); nothing of it is left", name, map[persist.State]string{persist.StateCreating: "creating it", persist.StateResetting: "resetting it"}[rec.State], rec.State))
		if err := o.discard(ctx, name, &rec); err != nil {
			l.Unlock()
			return nil, rec, false, err
		}
		// Remove ended the directory and its lock: take a fresh one.
		l.Unlock()
		l, err = o.store.Lock(name)
		if err != nil {
			return nil, rec, false, err
		}
		return l, persist.Record{}, false, nil
	}
	return l, rec, true, nil
}

// fresh creates the provider's kept state of rec in an empty directory
// without booting: Create, then Destroy of the instance (which keeps the
// kept state). On failure what it made is discarded by the caller.
func fresh(ctx context.Context, p provider.Provider, spec provider.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := provider.Refuse(p, spec); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Keep.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", spec.Keep.Dir, err)
	}
	in, err := p.Create(ctx, spec)
	if err != nil {
		return failure.With(failure.ErrRuntimeFailed, fmt.Errorf("create %s sandbox: %w", p.Name(), err))
	}
	if err := in.Destroy(); err != nil {
		return failure.With(failure.ErrRuntimeFailed, fmt.Errorf("create %s sandbox: release the runtime: %w", p.Name(), err))
	}
	return nil
}

// keptCmd is the common part of create, reset, destroy and list.
type keptCmd struct {
	name, keepRoot string
	stdout, stderr io.Writer
}

func (c *keptCmd) ops() keptOps {
	return keptOps{store: newStore(c.keepRoot), say: func(m string) { fmt.Fprintf(c.stderr, "oac-shim: %s\n", m) }}
}

func (c *keptCmd) fail(err error) int {
	fmt.Fprintf(c.stderr, "oac-shim: %v\n", err)
	if errors.Is(err, persist.ErrLocked) {
		fmt.Fprintln(c.stderr, "oac-shim: stop the shim that runs it first (its control API's stop, or SIGTERM)")
	}
	return failure.Exit(err)
}

func keptFlagSet(cmd string, c *keptCmd, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("oac-shim "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.keepRoot, "keep-root", "", "where kept sandboxes live (default "+persist.DefaultRoot()+")")
	if cmd != "list" {
		fs.StringVar(&c.name, "name", "", "sandbox name (required)")
	}
	c.stdout, c.stderr = stdout, stderr
	return fs
}

func parseKept(fs *flag.FlagSet, c *keptCmd, args []string, needName bool) int {
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2
	}
	if needName && c.name == "" {
		fmt.Fprintf(c.stderr, "%s: --name is required\n", fs.Name())
		return 2
	}
	if needName && !provider.ValidName(c.name) {
		fmt.Fprintf(c.stderr, "%s: --name must be 1 to 63 characters of a-z, 0-9 and '-', not starting with '-'\n", fs.Name())
		return 2
	}
	return 0
}

func osAllows(stderr io.Writer) error {
	_, v := osVerdict()
	switch v.Level {
	case ospolicy.Block:
		return failure.With(failure.ErrOSUnsupported, errors.New(v.Message))
	case ospolicy.Warn:
		fmt.Fprintf(stderr, "oac-shim: %s\n", v.Message)
	}
	return nil
}

// refuseKeptName refuses a throwaway sandbox (oac-shim run) named as a
// kept sandbox of store: nothing is created. A name the store cannot hold
// is not a kept one.
func refuseKeptName(store persist.Store, name string) error {
	_, err := store.Load(name)
	switch {
	case errors.Is(err, persist.ErrNotFound), errors.Is(err, provider.ErrInvalidSpec):
		return nil
	case err == nil, errors.Is(err, persist.ErrCorrupt):
		return failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: a kept sandbox named %s, nothing created (oac-shim start --name %s runs it; give this throwaway sandbox another name)", provider.ErrExists, name, name))
	}
	return failure.With(failure.ErrInvalidConfig, fmt.Errorf("cannot tell whether a kept sandbox named %s exists, nothing created (a throwaway sandbox must not take its name): %w", name, err))
}

// createCmd is oac-shim create: a record and the provider's kept state,
// nothing booted.
func createCmd(args []string, stdout, stderr io.Writer) int {
	c := &keptCmd{}
	fs := keptFlagSet("create", c, stdout, stderr)
	prov := fs.String("provider", "bwrap", "provider: "+strings.Join(provider.Names(), ", "))
	rootfs := fs.String("rootfs", "", "rootfs directory (default: the provider's default root)")
	agent := fs.String("agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	sandboxIO := fs.String("sandbox-io", "", "host binary to install as /usr/local/bin/oac-sandbox-io in the guest at every start")
	installs := installFlag{}
	fs.Var(installs, "install", "NAME=PATH: install a host binary as /usr/local/bin/NAME in the guest at every start (repeatable)")
	providers := provider.Declare(fs)
	if code := parseKept(fs, c, args, true); code != 0 {
		return code
	}
	mk, ok := providers[*prov]
	if !ok {
		fmt.Fprintf(stderr, "oac-shim create: unknown provider %q (have %s)\n", *prov, strings.Join(provider.Names(), ", "))
		return 2
	}
	for k, v := range installs {
		installs[k] = provider.AbsPath(v)
	}
	rec := persist.Record{
		Schema: persist.SchemaVersion, Name: c.name, Provider: *prov, State: persist.StateCreating,
		Flags: persist.Flags{Rootfs: provider.AbsPath(*rootfs), SandboxIO: provider.AbsPath(*sandboxIO), Provider: recordedProviderFlags(fs)},
	}
	if len(installs) > 0 {
		rec.Flags.Install = installs
	}
	if err := osAllows(stderr); err != nil {
		return c.fail(err)
	}
	p := mk()
	if _, err := keeperOf(p); err != nil {
		return c.fail(err)
	}
	agentPath := provider.AbsPath(*agent)
	if agentPath == "" {
		a, err := defaultAgentPath()
		if err != nil {
			return c.fail(failure.With(failure.ErrInvalidConfig, err))
		}
		agentPath = a
	}
	ctx := context.Background()
	ops := c.ops()
	l, _, found, err := ops.claim(ctx, c.name)
	if err != nil {
		if l != nil {
			l.Unlock()
		}
		return c.fail(err)
	}
	defer l.Unlock()
	if found {
		return c.fail(failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: kept sandbox %s already exists (oac-shim start, reset or destroy it)", provider.ErrExists, c.name)))
	}
	if err := createFresh(ctx, ops, p, &rec, agentPath, stderr); err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(stdout, "created %s (%s, image %s)\n", c.name, rec.Provider, rec.Image.Ref)
	return 0
}

// createFresh records rec as creating, makes the provider's kept state
// and records it created. On failure it discards everything it made.
func createFresh(ctx context.Context, ops keptOps, p provider.Provider, rec *persist.Record, agent string, stderr io.Writer) error {
	spec := specOf(*rec, agent, ops.store.Dir(rec.Name), stderr)
	img, err := imageOf(ctx, p, spec, rec.Flags.Provider)
	if err != nil {
		_ = ops.store.Remove(rec.Name)
		return failure.With(failure.ErrInvalidConfig, fmt.Errorf("nothing created: %w", err))
	}
	rec.Image, rec.Created, rec.State, rec.Message, rec.LastStarted = img, now(), persist.StateCreating, "", nil
	if err := ops.store.Save(*rec); err != nil {
		_ = ops.store.Remove(rec.Name)
		return err
	}
	if err := fresh(ctx, p, spec); err != nil {
		if derr := ops.discard(ctx, rec.Name, rec); derr != nil {
			return fmt.Errorf("%w; and removing what it made failed: %v", err, derr)
		}
		return fmt.Errorf("%w (nothing of it is left)", err)
	}
	rec.State = persist.StateCreated
	return ops.store.Save(*rec)
}

// startCmd is oac-shim start: oac-shim run on a kept sandbox.
func startCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f, code := parseRunFlags("start", args, stderr)
	if f == nil {
		return code
	}
	c := &keptCmd{name: f.name, keepRoot: f.keepRoot, stdout: stdout, stderr: stderr}
	var notes []string
	ops := keptOps{store: newStore(f.keepRoot), say: func(m string) {
		notes = append(notes, m)
		fmt.Fprintf(stderr, "oac-shim: %s\n", m)
	}}
	ctx := context.Background()
	l, rec, found, err := ops.claim(ctx, f.name)
	if err != nil {
		if l != nil {
			l.Unlock()
		}
		return c.fail(err)
	}
	if !found {
		_ = ops.store.Remove(f.name)
		l.Unlock()
		return c.fail(failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s (oac-shim create it first, or oac-shim run for a throwaway sandbox)", persist.ErrNotFound, f.name)))
	}
	p, err := providerOf(rec)
	if err != nil {
		l.Unlock()
		return c.fail(failure.With(failure.ErrInvalidConfig, err))
	}
	f.prov, f.rootfs, f.sandboxIO = rec.Provider, rec.Flags.Rootfs, rec.Flags.SandboxIO
	f.installs = installFlag{}
	for k, v := range rec.Flags.Install {
		f.installs[k] = v
	}
	f.providers = map[string]func() provider.Provider{rec.Provider: func() provider.Provider { return p }}
	spec := specOf(rec, f.agentPath, ops.store.Dir(f.name), stderr)
	if img, err := imageOf(ctx, p, spec, rec.Flags.Provider); err != nil {
		ops.say(fmt.Sprintf("the image of kept sandbox %s cannot be checked: %v", f.name, err))
	} else if img.Digest != rec.Image.Digest {
		ops.say(fmt.Sprintf("the image %s changed since kept sandbox %s was created (%s, now %s); it keeps what it made of the old one until oac-shim reset",
			rec.Image.Ref, f.name, orNone(rec.Image.Digest), orNone(img.Digest)))
	}
	k := &keptRun{ops: ops, lock: l, rec: rec, dir: ops.store.Dir(f.name), notes: notes, prov: p}
	defer l.Unlock()
	return runShim(f, k, stdin, stdout, stderr)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// keptRun is a kept sandbox a shim runs (oac-shim start): it holds the
// lock and keeps the record's state.
type keptRun struct {
	ops   keptOps
	lock  persist.Unlocker
	dir   string
	notes []string
	prov  provider.Provider

	mu  sync.Mutex
	rec persist.Record
}

func (k *keptRun) save(mut func(r *persist.Record)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	mut(&k.rec)
	return k.ops.store.Save(k.rec)
}

// started records the start.
func (k *keptRun) started() error {
	return k.save(func(r *persist.Record) {
		t := now()
		r.State, r.LastStarted, r.Message = persist.StateRunning, &t, ""
	})
}

// ended records how the run ended.
func (k *keptRun) ended(err error) {
	_ = k.save(func(r *persist.Record) {
		if err != nil {
			r.State, r.Message = persist.StateFailed, err.Error()
		} else {
			r.State, r.Message = persist.StateStopped, ""
		}
	})
}

// reset discards the kept state between the stop of one attempt and the
// start of the next (the control API's reset): the next Create makes it
// afresh from the recorded flags. The record keeps its name and flags.
func (k *keptRun) reset(ctx context.Context) error {
	if err := k.save(func(r *persist.Record) { r.State = persist.StateResetting }); err != nil {
		return err
	}
	failed := func(err error) error {
		_ = k.save(func(r *persist.Record) { r.State, r.Message = persist.StateFailed, err.Error() })
		return err
	}
	keeper, err := keeperOf(k.prov)
	if err != nil {
		return failed(err)
	}
	if err := keeper.Discard(ctx, k.rec.Name, k.dir); err != nil {
		return failed(fmt.Errorf("reset: discard the kept state: %w", err))
	}
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		return failed(fmt.Errorf("reset: %w", err))
	}
	return k.save(func(r *persist.Record) {
		t := now()
		r.State, r.Created, r.LastStarted = persist.StateRunning, t, &t
	})
}

// resetCmd is oac-shim reset: the kept sandbox back to its image, name
// and record kept.
func resetCmd(args []string, stdout, stderr io.Writer) int {
	c := &keptCmd{}
	fs := keptFlagSet("reset", c, stdout, stderr)
	agent := fs.String("agent", "", "oac-guest binary (default: oac-guest beside oac-shim)")
	if code := parseKept(fs, c, args, true); code != 0 {
		return code
	}
	if err := osAllows(stderr); err != nil {
		return c.fail(err)
	}
	ctx := context.Background()
	ops := c.ops()
	l, rec, found, err := ops.claim(ctx, c.name)
	if err != nil {
		if l != nil {
			l.Unlock()
		}
		return c.fail(err)
	}
	defer l.Unlock()
	if !found {
		_ = ops.store.Remove(c.name)
		return c.fail(failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s", persist.ErrNotFound, c.name)))
	}
	p, err := providerOf(rec)
	if err != nil {
		return c.fail(failure.With(failure.ErrInvalidConfig, err))
	}
	keeper, err := keeperOf(p)
	if err != nil {
		return c.fail(err)
	}
	agentPath := provider.AbsPath(*agent)
	if agentPath == "" {
		if agentPath, err = defaultAgentPath(); err != nil {
			return c.fail(failure.With(failure.ErrInvalidConfig, err))
		}
	}
	rec.State = persist.StateResetting
	if err := ops.store.Save(rec); err != nil {
		return c.fail(err)
	}
	dir := ops.store.Dir(c.name)
	if err := keeper.Discard(ctx, c.name, dir); err != nil {
		rec.State, rec.Message = persist.StateFailed, "reset: "+err.Error()
		_ = ops.store.Save(rec)
		return c.fail(fmt.Errorf("reset %s: %w (oac-shim reset or destroy it again)", c.name, err))
	}
	spec := specOf(rec, agentPath, dir, stderr)
	img, err := imageOf(ctx, p, spec, rec.Flags.Provider)
	if err == nil {
		rec.Image = img
		err = fresh(ctx, p, spec)
	}
	if err != nil {
		_ = keeper.Discard(ctx, c.name, dir)
		rec.State, rec.Message = persist.StateFailed, "reset: "+err.Error()
		_ = ops.store.Save(rec)
		return c.fail(fmt.Errorf("reset %s: %w (its kept state is gone; oac-shim reset it again or destroy it)", c.name, err))
	}
	t := now()
	rec.State, rec.Message, rec.Created, rec.LastStarted = persist.StateCreated, "", t, nil
	if err := ops.store.Save(rec); err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(stdout, "reset %s (%s, image %s)\n", c.name, rec.Provider, rec.Image.Ref)
	return 0
}

// destroyCmd is oac-shim destroy: every byte of the kept sandbox.
func destroyCmd(args []string, stdout, stderr io.Writer) int {
	c := &keptCmd{}
	fs := keptFlagSet("destroy", c, stdout, stderr)
	if code := parseKept(fs, c, args, true); code != 0 {
		return code
	}
	ctx := context.Background()
	ops := c.ops()
	l, rec, found, err := ops.claim(ctx, c.name)
	if l == nil {
		return c.fail(err)
	}
	defer l.Unlock()
	var r *persist.Record
	if err == nil && found {
		r = &rec
	} else if err != nil {
		fmt.Fprintf(stderr, "oac-shim: %v; removing what every provider may have kept for %s\n", err, c.name)
	}
	if derr := ops.discard(ctx, c.name, r); derr != nil {
		return c.fail(derr)
	}
	if !found {
		return c.fail(failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s", persist.ErrNotFound, c.name)))
	}
	fmt.Fprintf(stdout, "destroyed %s\n", c.name)
	return 0
}

// ListEntry is one kept sandbox in oac-shim list.
type ListEntry struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	// Image is the image's reference; ImageDigest its digest when known.
	Image       string `json:"image"`
	ImageDigest string `json:"image_digest,omitempty"`
	// State is the last state; "running" only while a shim runs it (a
	// shim that died running it leaves "stopped").
	State       persist.State `json:"state"`
	Message     string        `json:"message,omitempty"`
	Created     time.Time     `json:"created"`
	LastStarted *time.Time    `json:"last_started,omitempty"`
	// SizeBytes is what its state directory takes on disk.
	SizeBytes int64 `json:"size_bytes"`
	// InUse: a shim holds it now.
	InUse bool `json:"in_use"`
}

// ListReport is what oac-shim list --json prints.
type ListReport struct {
	SchemaVersion int         `json:"schema_version"`
	Sandboxes     []ListEntry `json:"sandboxes"`
}

// List returns the kept sandboxes of store. What a killed create left
// is discarded (said through say) and not listed; a record that cannot
// be read is listed with state "failed" and why.
func List(ctx context.Context, store persist.Store, say func(string)) (ListReport, error) {
	rep := ListReport{SchemaVersion: api.SchemaVersion, Sandboxes: []ListEntry{}}
	names, err := store.List()
	if err != nil {
		return rep, err
	}
	ops := keptOps{store: store, say: say}
	for _, n := range names {
		held := store.Held(n)
		rec, err := store.Load(n)
		if !held && (errors.Is(err, persist.ErrNotFound) || (err == nil && rec.State.Unfinished())) {
			l, _, found, cerr := ops.claim(ctx, n)
			if cerr == nil && !found {
				_ = store.Remove(n)
			}
			if l != nil {
				l.Unlock()
			}
			continue
		}
		e := ListEntry{Name: n, InUse: held, SizeBytes: persist.DiskUsage(storeDirOf(store, n))}
		if err != nil {
			e.State, e.Message = persist.StateFailed, err.Error()
			rep.Sandboxes = append(rep.Sandboxes, e)
			continue
		}
		e.Provider, e.Image, e.ImageDigest, e.State, e.Message = rec.Provider, rec.Image.Ref, rec.Image.Digest, rec.State, rec.Message
		e.Created, e.LastStarted = rec.Created, rec.LastStarted
		if e.State == persist.StateRunning && !held {
			e.State = persist.StateStopped
		}
		rep.Sandboxes = append(rep.Sandboxes, e)
	}
	slices.SortFunc(rep.Sandboxes, func(a, b ListEntry) int { return strings.Compare(a.Name, b.Name) })
	return rep, nil
}

// storeDirOf is the directory whose size list shows: the sandbox's whole
// directory in a file store (record and state), else its state directory.
func storeDirOf(s persist.Store, name string) string {
	return strings.TrimSuffix(s.Dir(name), "/state")
}

func listCmd(args []string, stdout, stderr io.Writer) int {
	c := &keptCmd{}
	fs := keptFlagSet("list", c, stdout, stderr)
	asJSON := fs.Bool("json", false, "print one JSON object (schema/list.schema.json)")
	if code := parseKept(fs, c, args, false); code != 0 {
		return code
	}
	ops := c.ops()
	rep, err := List(context.Background(), ops.store, ops.say)
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		return 0
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPROVIDER\tIMAGE\tSTATE\tSIZE")
	for _, e := range rep.Sandboxes {
		st := string(e.State)
		if e.InUse {
			st += " (in use)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.Name, orDash(e.Provider), orDash(e.Image), st, humanSize(e.SizeBytes))
	}
	_ = w.Flush()
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
