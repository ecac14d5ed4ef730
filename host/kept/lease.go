package kept

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/crashpoint"
)

// Lease is a kept sandbox a shim runs (oac-shim start): it holds the
// name's lock until Close and keeps the record's state.
type Lease struct {
	// Provider is the record's provider, made with its recorded flags.
	Provider provider.Provider
	// Dir is the provider's kept state directory (provider.Keep.Dir).
	Dir string
	// Notes are what the start found (a discarded leftover, a changed
	// image), for the sandbox's kept events.
	Notes []string

	svc  *Service
	lock persist.Unlocker
	mu   sync.Mutex
	rec  persist.Record
}

// Record returns the sandbox's record as the lease last saved it.
func (k *Lease) Record() persist.Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rec
}

// Start claims a kept sandbox to run it. agent is the oac-guest binary
// (to name the image as a create would).
func (s *Service) Start(ctx context.Context, name, agent string, stderr io.Writer) (*Lease, error) {
	var notes []string
	say := s.Say
	ss := *s
	ss.Say = func(m string) { notes = append(notes, m); say(m) }
	l, rec, err := ss.claimFound(ctx, name, "oac-shim create it first, or oac-shim run for a throwaway sandbox")
	if err != nil {
		return nil, err
	}
	p, err := ProviderOf(rec)
	if err != nil {
		l.Unlock()
		return nil, failure.With(failure.ErrInvalidConfig, err)
	}
	crashpoint.Hit(crashpoint.StartClaimed)
	spec := specOf(rec, agent, s.Store.Dir(name), stderr)
	if img, err := imageOf(ctx, p, spec, rec.Flags.Provider); err != nil {
		ss.Say(fmt.Sprintf("the image of kept sandbox %s cannot be checked: %v", name, err))
	} else if img.Digest != rec.Image.Digest {
		ss.Say(fmt.Sprintf("the image %s changed since kept sandbox %s was created (%s, now %s); it keeps what it made of the old one until oac-shim reset",
			rec.Image.Ref, name, orNone(rec.Image.Digest), orNone(img.Digest)))
	}
	return &Lease{Provider: p, Dir: s.Store.Dir(name), Notes: notes, svc: s, lock: l, rec: rec}, nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (k *Lease) save(mut func(r *persist.Record)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	mut(&k.rec)
	return k.svc.Store.Save(k.rec)
}

// Started records the start.
func (k *Lease) Started() error {
	err := k.save(func(r *persist.Record) {
		t := k.svc.Now()
		r.State, r.LastStarted, r.Message = persist.StateRunning, &t, ""
	})
	crashpoint.Hit(crashpoint.StartRecorded)
	return err
}

// Ended records how the run ended.
func (k *Lease) Ended(err error) {
	_ = k.save(func(r *persist.Record) {
		if err != nil {
			r.State, r.Message = persist.StateFailed, err.Error()
		} else {
			r.State, r.Message = persist.StateStopped, ""
		}
	})
}

// Reset discards the kept state between the stop of one attempt and the
// start of the next (the control API's reset): the next Create makes it
// afresh from the recorded flags. The record keeps its name and flags.
func (k *Lease) Reset(ctx context.Context) error {
	if err := k.save(func(r *persist.Record) { r.State = persist.StateResetting }); err != nil {
		return err
	}
	failed := func(err error) error {
		_ = k.save(func(r *persist.Record) { r.State, r.Message = persist.StateFailed, err.Error() })
		return err
	}
	keeper, err := keeperOf(k.Provider)
	if err != nil {
		return failed(err)
	}
	if err := keeper.Discard(ctx, k.rec.Name, k.Dir); err != nil {
		return failed(fmt.Errorf("reset: discard the kept state: %w", err))
	}
	if err := os.MkdirAll(k.Dir, 0o700); err != nil {
		return failed(fmt.Errorf("reset: %w", err))
	}
	return k.save(func(r *persist.Record) {
		t := k.svc.Now()
		r.State, r.Created, r.LastStarted = persist.StateRunning, t, &t
	})
}

// Close drops the lock.
func (k *Lease) Close() { k.lock.Unlock() }

// Reservation holds a name for a throwaway sandbox (oac-shim run).
type Reservation struct {
	svc  *Service
	name string
	lock persist.Unlocker
}

// Reserve takes name's lock for a throwaway sandbox and holds it until
// Close, so no kept sandbox of the name is created, started or discarded
// while it runs: the provider's objects of the name (a container, a
// distribution) are the throwaway sandbox's. A kept sandbox of the name
// (or an unreadable record) is refused with ErrExists before anything is
// made; what a killed command left of the name is discarded first, and
// said.
func (s *Service) Reserve(ctx context.Context, name string) (*Reservation, error) {
	l, _, found, err := s.claim(ctx, name)
	switch {
	case l == nil && errors.Is(err, provider.ErrInvalidSpec):
		// A name the store cannot hold is no kept sandbox's.
		return &Reservation{}, nil
	case l == nil && errors.Is(err, fs.ErrPermission):
		// A keep root this user cannot write (a user with no home): no
		// create of this user's can race the run there, so reading
		// the record is enough.
		_, lerr := s.Store.Load(name)
		switch {
		case errors.Is(lerr, persist.ErrNotFound):
			return &Reservation{}, nil
		case lerr == nil, errors.Is(lerr, persist.ErrCorrupt):
			return nil, keptName(name)
		}
		return nil, cannotTell(name, lerr)
	case errors.Is(err, persist.ErrLocked):
		return nil, failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: %s is in use by another oac-shim (a kept sandbox started, created, reset or destroyed, or a throwaway one running), nothing created", provider.ErrExists, name))
	case found:
		l.Unlock()
		return nil, keptName(name)
	case err != nil:
		if l != nil {
			l.Unlock()
		}
		return nil, cannotTell(name, err)
	}
	crashpoint.Hit(crashpoint.RunLocked)
	s.sweep(ctx, name)
	return &Reservation{svc: s, name: name, lock: l}, nil
}

func keptName(name string) error {
	return failure.With(failure.ErrInvalidConfig, fmt.Errorf("%w: a kept sandbox named %s, nothing created (oac-shim start %s runs it; give this throwaway sandbox another name)", provider.ErrExists, name, name))
}

func cannotTell(name string, err error) error {
	return failure.With(failure.ErrInvalidConfig, fmt.Errorf("cannot tell whether a kept sandbox named %s exists, nothing created (a throwaway sandbox must not take its name): %w", name, err))
}

// Close removes the name's directory in the keep root and drops the lock.
func (r *Reservation) Close() {
	if r.lock == nil {
		return
	}
	_ = r.svc.Store.Remove(r.name)
	r.lock.Unlock()
	r.lock = nil
}
