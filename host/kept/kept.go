package kept

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/crashpoint"
)

// Service carries out the kept-sandbox commands on one store.
type Service struct {
	Store persist.Store
	// Say reports what a command found and did, one line each.
	Say func(string)
	// Now is the records' clock.
	Now func() time.Time
}

// New returns the service of store; say may be nil.
func New(store persist.Store, say func(string)) *Service {
	if say == nil {
		say = func(string) {}
	}
	return &Service{Store: store, Say: say, Now: func() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }}
}

// Open returns the service of the file store under root (persist.DefaultRoot
// when empty).
func Open(root string, say func(string)) *Service {
	if root == "" {
		root = persist.DefaultRoot()
	}
	return New(persist.NewFileStore(provider.AbsPath(root)), say)
}

// ProviderOf makes the record's provider with its recorded flags.
func ProviderOf(r persist.Record) (provider.Provider, error) {
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
func specOf(r persist.Record, agent, dir string, stderr io.Writer) provider.Spec {
	return provider.Spec{
		Name: r.Name, AgentPath: agent, Rootfs: r.Flags.Rootfs, Stderr: stderr,
		SandboxIOPath: r.Flags.SandboxIO, Install: r.Flags.Install, Keep: &provider.Keep{Dir: dir},
	}
}

// discard removes every byte kept for name: the provider's (the record's
// provider, or every provider that keeps when the record cannot say) and
// the store's. The caller holds the lock.
func (s *Service) discard(ctx context.Context, name string, rec *persist.Record) error {
	if err := s.discardProvider(ctx, name, rec); err != nil {
		return err
	}
	if err := s.Store.Remove(name); err != nil {
		return fmt.Errorf("discard kept sandbox %s: %w", name, err)
	}
	return nil
}

// discardProvider is the provider's half of discard: the record stays,
// for the next command to finish the job if this one dies.
func (s *Service) discardProvider(ctx context.Context, name string, rec *persist.Record) error {
	dir := s.Store.Dir(name)
	var errs []error
	var ps []provider.Provider
	if rec != nil {
		if p, err := ProviderOf(*rec); err == nil {
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
				s.Say(fmt.Sprintf("%s kept nothing it can discard here: %v", p.Name(), err))
			case err != nil:
				errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("discard kept sandbox %s: %w", name, errors.Join(errs...))
	}
	return nil
}

var unfinishedWhat = map[persist.State]string{
	persist.StateCreating:   "creating it",
	persist.StateResetting:  "resetting it",
	persist.StateDestroying: "destroying it",
}

// claim takes name's lock and loads its record. What a shim killed half
// way through a create, reset or destroy left (a record in an unfinished
// state, a directory without a record) is discarded first and said;
// found is then false. A record that cannot be read is returned as the
// error (with found true) for the caller to refuse or, for destroy, to
// remove. On an error the lock, when taken, is returned held.
func (s *Service) claim(ctx context.Context, name string) (l persist.Unlocker, rec persist.Record, found bool, err error) {
	existed := s.Store.Exists(name)
	l, err = s.Store.Lock(name)
	if err != nil {
		return nil, rec, false, err
	}
	rec, err = s.Store.Load(name)
	switch {
	case errors.Is(err, persist.ErrNotFound):
		if existed {
			// A create killed before its first save, or a throwaway
			// sandbox's shim killed: the record is written before a
			// provider makes anything, so there is only the directory
			// and its lock (what a run made at runtime is its
			// provider's to sweep).
			if err := s.Store.Remove(name); err != nil {
				return l, rec, false, err
			}
			s.Say(fmt.Sprintf("removed what a killed oac-shim left of %s (a directory with no record); nothing of it is left", name))
			l.Unlock()
			if l, err = s.Store.Lock(name); err != nil {
				return nil, rec, false, err
			}
		}
		return l, rec, false, nil
	case err != nil:
		return l, rec, true, err
	case persist.Unfinished(rec.State):
		if err := s.discard(ctx, name, &rec); err != nil {
			return l, rec, false, err
		}
		s.Say(fmt.Sprintf("discarded kept sandbox %s: a shim was killed while it was %s (state %q, no shim holds it); nothing of it is left", name, unfinishedWhat[rec.State], rec.State))
		// Remove ended the directory and its lock: take a fresh one.
		l.Unlock()
		if l, err = s.Store.Lock(name); err != nil {
			return nil, rec, false, err
		}
		return l, persist.Record{}, false, nil
	case rec.State == persist.StateRunning:
		// Running, and no shim holds it: its shim was killed. What that
		// run made at runtime is the provider's to sweep at the next
		// Create; what it kept stays.
		s.Say(fmt.Sprintf("kept sandbox %s was running when its shim was killed (no shim holds it); what it kept is kept", name))
	}
	return l, rec, true, nil
}

// claimFound is claim for the commands that act on an existing sandbox:
// a name with no sandbox is refused (and its directory removed), with
// hint added to the error when given.
func (s *Service) claimFound(ctx context.Context, name, hint string) (persist.Unlocker, persist.Record, error) {
	l, rec, found, err := s.claim(ctx, name)
	if err != nil {
		if l != nil {
			l.Unlock()
		}
		return nil, rec, err
	}
	if !found {
		_ = s.Store.Remove(name)
		l.Unlock()
		if hint != "" {
			name += " (" + hint + ")"
		}
		return nil, rec, failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s", persist.ErrNotFound, name))
	}
	return l, rec, nil
}

// fresh creates the provider's kept state of spec in an empty directory
// without booting: Create, then Destroy of the instance (which keeps the
// kept state). made is the crash point between the two. On failure what
// it made is discarded by the caller.
func fresh(ctx context.Context, p provider.Provider, spec provider.Spec, made crashpoint.Point) error {
	if err := provider.CheckSpec(p, spec); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Keep.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", spec.Keep.Dir, err)
	}
	in, err := p.Create(ctx, spec)
	if err != nil {
		return failure.With(failure.ErrRuntimeFailed, fmt.Errorf("create %s sandbox: %w", p.Name(), err))
	}
	crashpoint.Hit(made)
	if err := in.Destroy(); err != nil {
		return failure.With(failure.ErrRuntimeFailed, fmt.Errorf("create %s sandbox: release the runtime: %w", p.Name(), err))
	}
	return nil
}

// CreateRequest is what oac-shim create was given.
type CreateRequest struct {
	Name     string
	Provider string
	// ProviderFlags are the provider's own flags given, "--NAME=VALUE".
	ProviderFlags []string
	Rootfs        string
	SandboxIO     string
	Install       map[string]string
	// Agent is the oac-guest binary.
	Agent  string
	Stderr io.Writer
}

// Create records a new kept sandbox and makes the provider's kept state,
// booting nothing. On failure nothing of it is left.
func (s *Service) Create(ctx context.Context, req CreateRequest) (persist.Record, error) {
	rec := persist.Record{
		Schema: persist.SchemaVersion, Name: req.Name, Provider: req.Provider, State: persist.StateCreating,
		Flags: persist.Flags{Rootfs: req.Rootfs, SandboxIO: req.SandboxIO, Provider: req.ProviderFlags},
	}
	if len(req.Install) > 0 {
		rec.Flags.Install = req.Install
	}
	p, err := ProviderOf(rec)
	if err != nil {
		return rec, failure.With(failure.ErrInvalidConfig, err)
	}
	if _, err := keeperOf(p); err != nil {
		return rec, err
	}
	l, _, found, err := s.claim(ctx, req.Name)
	if l != nil {
		defer l.Unlock()
	}
	if err != nil {
		return rec, err
	}
	crashpoint.Hit(crashpoint.CreateLocked)
	if found {
		return rec, failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: kept sandbox %s already exists (oac-shim start, reset or destroy it)", provider.ErrExists, req.Name))
	}
	spec := specOf(rec, req.Agent, s.Store.Dir(rec.Name), req.Stderr)
	img, err := imageOf(ctx, p, spec, rec.Flags.Provider)
	if err != nil {
		_ = s.Store.Remove(rec.Name)
		return rec, failure.With(failure.ErrInvalidConfig, fmt.Errorf("nothing created: %w", err))
	}
	rec.Image, rec.Created = img, s.Now()
	if err := s.Store.Save(rec); err != nil {
		_ = s.Store.Remove(rec.Name)
		return rec, err
	}
	crashpoint.Hit(crashpoint.CreateRecordWritten)
	if err := fresh(ctx, p, spec, crashpoint.CreateProviderState); err != nil {
		if derr := s.discard(ctx, rec.Name, &rec); derr != nil {
			return rec, fmt.Errorf("%w; and removing what it made failed: %v", err, derr)
		}
		return rec, fmt.Errorf("%w (nothing of it is left)", err)
	}
	crashpoint.Hit(crashpoint.CreateReleased)
	rec.State = persist.StateCreated
	if err := s.Store.Save(rec); err != nil {
		return rec, err
	}
	crashpoint.Hit(crashpoint.CreateRecorded)
	return rec, nil
}

// Reset discards a kept sandbox's state and makes it afresh from its
// image: name and record kept. Killed half way, the next command finds
// "resetting" and discards the sandbox.
func (s *Service) Reset(ctx context.Context, name, agent string, stderr io.Writer) (persist.Record, error) {
	l, rec, err := s.claimFound(ctx, name, "")
	if err != nil {
		return rec, err
	}
	defer l.Unlock()
	p, err := ProviderOf(rec)
	if err != nil {
		return rec, failure.With(failure.ErrInvalidConfig, err)
	}
	keeper, err := keeperOf(p)
	if err != nil {
		return rec, err
	}
	rec.State = persist.StateResetting
	if err := s.Store.Save(rec); err != nil {
		return rec, err
	}
	crashpoint.Hit(crashpoint.ResetMarked)
	dir := s.Store.Dir(name)
	failed := func(err error) error {
		rec.State, rec.Message = persist.StateFailed, "reset: "+err.Error()
		_ = s.Store.Save(rec)
		return err
	}
	if err := keeper.Discard(ctx, name, dir); err != nil {
		return rec, failed(fmt.Errorf("reset %s: %w (oac-shim reset or destroy it again)", name, err))
	}
	crashpoint.Hit(crashpoint.ResetDiscarded)
	spec := specOf(rec, agent, dir, stderr)
	img, err := imageOf(ctx, p, spec, rec.Flags.Provider)
	if err == nil {
		rec.Image = img
		err = fresh(ctx, p, spec, crashpoint.ResetProviderState)
	}
	if err != nil {
		_ = keeper.Discard(ctx, name, dir)
		return rec, failed(fmt.Errorf("reset %s: %w (its kept state is gone; oac-shim reset it again or destroy it)", name, err))
	}
	rec.State, rec.Message, rec.Created, rec.LastStarted = persist.StateCreated, "", s.Now(), nil
	if err := s.Store.Save(rec); err != nil {
		return rec, err
	}
	crashpoint.Hit(crashpoint.ResetRecorded)
	return rec, nil
}

// Destroy removes every byte of a kept sandbox. An unreadable record is
// removed with what every provider may have kept for the name.
func (s *Service) Destroy(ctx context.Context, name string) error {
	l, rec, found, err := s.claim(ctx, name)
	if l == nil {
		return err
	}
	defer l.Unlock()
	var r *persist.Record
	switch {
	case err != nil:
		s.Say(fmt.Sprintf("%v; removing what every provider may have kept for %s", err, name))
	case found:
		r = &rec
		rec.State = persist.StateDestroying
		if err := s.Store.Save(rec); err != nil {
			return err
		}
		crashpoint.Hit(crashpoint.DestroyMarked)
	}
	if err := s.discardProvider(ctx, name, r); err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.DestroyDiscarded)
	if err := s.Store.Remove(name); err != nil {
		return fmt.Errorf("destroy kept sandbox %s: %w", name, err)
	}
	if !found {
		return failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s", persist.ErrNotFound, name))
	}
	return nil
}

// List returns the kept sandboxes. What a killed command left is
// discarded (and said) and not listed; a record that cannot be read is
// listed with state "failed" and why.
func (s *Service) List(ctx context.Context) (api.ListReport, error) {
	rep := api.ListReport{SchemaVersion: api.SchemaVersion, Sandboxes: []api.ListEntry{}}
	names, err := s.Store.List()
	if err != nil {
		return rep, err
	}
	for _, n := range names {
		held := s.Store.Held(n)
		rec, err := s.Store.Load(n)
		if !held && (errors.Is(err, persist.ErrNotFound) || (err == nil && persist.Unfinished(rec.State))) {
			s.tidy(ctx, n)
			continue
		}
		if errors.Is(err, persist.ErrNotFound) {
			continue // a throwaway sandbox's name, or a create before its first save
		}
		e := api.ListEntry{Name: n, InUse: held, SizeBytes: persist.DiskUsage(storeDirOf(s.Store, n))}
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
	slices.SortFunc(rep.Sandboxes, func(a, b api.ListEntry) int { return strings.Compare(a.Name, b.Name) })
	return rep, nil
}

// tidy discards what a killed command left under name, when no shim
// holds it (claim says what it found).
func (s *Service) tidy(ctx context.Context, name string) {
	l, _, found, err := s.claim(ctx, name)
	if err == nil && !found {
		_ = s.Store.Remove(name)
	}
	if l != nil {
		l.Unlock()
	}
}

// sweep removes the directories that killed commands left with no record
// under other names than skip (a throwaway run's, a create's before its
// first save): a run's name is seldom used again, so its next command may
// never come. Records, even unfinished ones, are left to the commands on
// their names and to list.
func (s *Service) sweep(ctx context.Context, skip string) {
	names, err := s.Store.List()
	if err != nil {
		return
	}
	for _, n := range names {
		if n == skip || s.Store.Held(n) {
			continue
		}
		if _, err := s.Store.Load(n); errors.Is(err, persist.ErrNotFound) {
			s.tidy(ctx, n)
		}
	}
}

// storeDirOf is the directory whose size list shows: the sandbox's whole
// directory in a file store (record and state), else its state directory.
func storeDirOf(s persist.Store, name string) string {
	return strings.TrimSuffix(s.Dir(name), "/state")
}
