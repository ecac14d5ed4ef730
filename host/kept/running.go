package kept

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/statedir"
	"github.com/oac/sandbox-agent/internal/strictjson"
)

// The running sandboxes of a keep root: every shim that runs one (run and
// start alike) announces itself under KEEP_ROOT/running/sandboxes/NAME
// (statedir: 0700, its lock held until the shim exits) with a record of
// how to reach it, written by the shim itself (never a path the guest
// chooses). A held lock means the shim lives; a record whose lock is free
// is a dead shim's, reported and removed, never taken for a live one.

const (
	runningDir = "running"
	shimFile   = "shim.json"
	// MaxShimRecord bounds a shim's record.
	MaxShimRecord = 16 << 10
	// ShimRecordSchema is the version of ShimRecord this build writes
	// and reads.
	ShimRecordSchema = 1
)

// ErrBadShimRecord wraps every refusal of a shim's record.
var ErrBadShimRecord = errors.New("unreadable shim record")

// ErrNoRecord: a live shim holds the entry and has written no record yet
// (an outliving shim between its claim and its publish).
var ErrNoRecord = errors.New("its shim has written none yet")

// ShimRecord is what a running shim says about itself.
type ShimRecord struct {
	Schema   int    `json:"schema"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Provider string `json:"provider"`
	PID      int    `json:"pid"`
	// ProcStart is when the process started as the OS counts it (Linux:
	// clock ticks after boot, /proc/PID/stat's 22nd field), so a reused
	// pid is never taken for the shim's; 0 where the OS does not say.
	ProcStart     uint64 `json:"proc_start"`
	ControlSocket string `json:"control_socket,omitempty"`
	// OutliveParent: the shim runs with --outlive-parent (its journal is
	// in the entry).
	OutliveParent bool      `json:"outlive_parent,omitempty"`
	Started       time.Time `json:"started"`
	Version       string    `json:"version"`
}

var shimSchema = func() *strictjson.Schema {
	s := strictjson.ForType(reflect.TypeFor[ShimRecord]())
	for i := range s.Fields {
		if s.Fields[i].Name != "control_socket" && s.Fields[i].Name != "outlive_parent" {
			s.Fields[i].Required = true
		}
	}
	return s
}()

// DecodeShimRecord reads a record strictly: at most MaxShimRecord bytes,
// exactly ShimRecord's fields, each once; a valid name, kind, pid and an
// absolute control socket path.
func DecodeShimRecord(data []byte) (ShimRecord, error) {
	var r ShimRecord
	if len(data) > MaxShimRecord {
		return r, fmt.Errorf("%w: larger than %d bytes", ErrBadShimRecord, MaxShimRecord)
	}
	if err := strictjson.Check(data, shimSchema); err != nil {
		return r, fmt.Errorf("%w: %v", ErrBadShimRecord, err)
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrBadShimRecord, err)
	}
	return r, r.validate()
}

func (r ShimRecord) validate() error {
	switch {
	case r.Schema != ShimRecordSchema:
		return fmt.Errorf("%w: schema %d (this oac-shim reads %d)", ErrBadShimRecord, r.Schema, ShimRecordSchema)
	case !provider.ValidName(r.Name):
		return fmt.Errorf("%w: invalid sandbox name", ErrBadShimRecord)
	case r.Kind != api.RunThrowaway && r.Kind != api.RunKept:
		return fmt.Errorf("%w: unknown kind", ErrBadShimRecord)
	case r.PID <= 0:
		return fmt.Errorf("%w: no pid", ErrBadShimRecord)
	case r.ControlSocket != "" && (!filepath.IsAbs(r.ControlSocket) || len(r.ControlSocket) > 4096 || strings.ContainsRune(r.ControlSocket, 0)):
		return fmt.Errorf("%w: the control socket is not an absolute path", ErrBadShimRecord)
	case len(r.Provider) > 64 || len(r.Version) > 256:
		return fmt.Errorf("%w: a field is too long", ErrBadShimRecord)
	}
	return nil
}

// Registry is the running shims of one keep root.
type Registry struct {
	// Root is KEEP_ROOT/running.
	Root string
}

// OpenRegistry returns the registry of keepRoot (persist.DefaultRoot when
// empty).
func OpenRegistry(keepRoot string) *Registry {
	if keepRoot == "" {
		keepRoot = persist.DefaultRoot()
	}
	return &Registry{Root: filepath.Join(provider.AbsPath(keepRoot), runningDir)}
}

// Announcement is a shim's entry in the registry, held until Close.
type Announcement struct {
	dir  *statedir.Dir
	name string
	// keep names the files Close leaves for a reader (an outliving
	// shim's journal); nil: Close removes everything.
	keep func(string) bool
}

// Announce claims rec.Name in the registry and writes rec there. Another
// live shim of the name is refused (provider.ErrExists); a dead one's
// leftover is taken over.
func (g *Registry) Announce(rec ShimRecord) (*Announcement, error) {
	if err := rec.validateNew(); err != nil {
		return nil, err
	}
	a, err := g.Claim(rec.Name)
	if err != nil {
		return nil, err
	}
	if err := a.Publish(rec); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// Claim takes name's entry in the registry without a record yet: an
// outliving shim keeps its journal and control socket in the entry's
// directory (Dir) from its start, and Publishes its record once it
// serves them. Until then it is not listed (Scan waits a moment for the
// record of a held entry, then says it has none).
func (g *Registry) Claim(name string) (*Announcement, error) {
	// The keep root as persist makes it (0711: a kept sandbox's guest
	// root reaches its state/ through it); the registry is the user's own.
	if err := os.MkdirAll(filepath.Dir(g.Root), 0o711); err != nil {
		return nil, fmt.Errorf("announce the running sandbox %s: %w", name, err)
	}
	if err := os.Mkdir(g.Root, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("announce the running sandbox %s: %w", name, err)
	}
	d, err := statedir.Claim(g.Root, name)
	if err != nil {
		return nil, fmt.Errorf("announce the running sandbox %s: %w", name, err)
	}
	return &Announcement{dir: d, name: name}, nil
}

// Dir is the entry's directory, the shim's own (0700).
func (a *Announcement) Dir() string { return a.dir.Path }

// Publish writes the shim's record in its entry: from now on it is
// listed, and stop reaches it.
func (a *Announcement) Publish(rec ShimRecord) error {
	if err := rec.validateNew(); err != nil {
		return err
	}
	if rec.Name != a.name {
		return fmt.Errorf("announce the running sandbox %s: the record names %q", a.name, rec.Name)
	}
	rec.Schema = ShimRecordSchema
	data, err := json.MarshalIndent(rec, "", "  ")
	if err == nil {
		err = a.dir.WriteFile(shimFile, append(data, '\n'))
	}
	if err != nil {
		return fmt.Errorf("announce the running sandbox %s: %w", rec.Name, err)
	}
	return nil
}

// KeepOnClose makes Close leave the files keep names (and the free lock)
// for a reader: an outliving shim's journal, whose final events an
// oac-shim attach reads after the shim has gone. The next claim, listing
// or stop under the keep root removes them, as it removes a dead shim's
// entry, without reporting them.
func (a *Announcement) KeepOnClose(keep func(string) bool) { a.keep = keep }

// Close removes the entry (but what KeepOnClose names); safe on nil and
// more than once.
func (a *Announcement) Close() {
	if a == nil {
		return
	}
	if a.keep != nil {
		// The record goes first: an entry without one is an ended
		// shim's, never taken for a live or a killed one.
		a.dir.ReleaseKeeping(func(name string) bool { return name != shimFile && a.keep(name) })
		return
	}
	a.dir.Release()
}

// validateNew checks a record about to be written (its schema is set by
// Publish).
func (r ShimRecord) validateNew() error {
	r.Schema = ShimRecordSchema
	return r.validate()
}

// Running is one live shim List found.
type Running struct {
	Record ShimRecord
	// Err says why its record cannot be read (Record has the name only).
	Err error
}

// Entry is r as oac-shim list --running prints it.
func (r Running) Entry() api.RunningEntry {
	e := api.RunningEntry{Name: r.Record.Name}
	if r.Err != nil {
		e.Message = r.Err.Error()
		return e
	}
	e.Kind, e.Provider, e.PID, e.ControlSocket, e.OutliveParent, e.Started, e.Version =
		r.Record.Kind, r.Record.Provider, r.Record.PID, r.Record.ControlSocket, r.Record.OutliveParent, r.Record.Started, r.Record.Version
	return e
}

// List returns the live shims by name, and removes (and returns) what dead
// ones left.
func (g *Registry) List() ([]Running, []api.CleanedEntry, error) {
	found, err := statedir.Scan(g.Root, shimFile, MaxShimRecord)
	if err != nil {
		return nil, nil, fmt.Errorf("list the running sandboxes: %w", err)
	}
	live := []Running{}
	cleaned := []api.CleanedEntry{}
	for _, f := range found {
		if !f.Held {
			// An entry without a record was never listed (a shim killed
			// before it wrote one) or is an ended outliving shim's
			// journal (KeepOnClose): removed without a word.
			if !errors.Is(f.Err, os.ErrNotExist) {
				cleaned = append(cleaned, api.CleanedEntry{Name: f.Name, Message: deadMessage(f)})
			}
			continue
		}
		r := Running{Record: ShimRecord{Name: f.Name}, Err: f.Err}
		if f.Err == nil {
			rec, err := DecodeShimRecord(f.Record)
			if err == nil && rec.Name != f.Name {
				err = fmt.Errorf("%w: it names %q", ErrBadShimRecord, rec.Name)
			}
			if err != nil {
				r.Err = err
			} else {
				r.Record = rec
			}
		} else if errors.Is(f.Err, os.ErrNotExist) {
			r.Err = fmt.Errorf("%w: its shim has written none", ErrBadShimRecord)
		}
		live = append(live, r)
	}
	slices.SortFunc(live, func(a, b Running) int { return strings.Compare(a.Record.Name, b.Record.Name) })
	return live, cleaned, nil
}

func deadMessage(f statedir.Found) string {
	msg := "its shim died without removing its record (killed or crashed); removed"
	if rec, err := DecodeShimRecord(f.Record); err == nil {
		msg = fmt.Sprintf("its shim (pid %d, started %s) died without removing its record (killed or crashed); removed",
			rec.PID, rec.Started.Format(time.RFC3339))
	}
	return msg
}

// Watch watches the present shim of name let go of its entry (it exited).
func (g *Registry) Watch(name string) (*statedir.Holder, error) {
	if !provider.ValidName(name) {
		return nil, fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	return statedir.Watch(g.Root, name)
}

// Sweep removes what dead shims left in the registry.
func (g *Registry) Sweep() { statedir.Sweep(g.Root, "") }

// EntryDir is the directory of name's entry (its shim's while it runs).
func (g *Registry) EntryDir(name string) string { return filepath.Join(g.Root, "sandboxes", name) }

// Left is what an entry whose shim is gone holds: a killed shim's record
// (Record) or, an ended outliving shim's, none; and the directory, for
// its journal.
type Left struct {
	Dir string
	// Record is the killed shim's (nil: the shim ended and removed it,
	// or never wrote one).
	Record *ShimRecord
}

// Leftover finds what a gone shim of name left: os.ErrNotExist when there
// is nothing, or a live shim holds the entry again.
func (g *Registry) Leftover(name string) (Left, error) {
	if !provider.ValidName(name) {
		return Left{}, fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	h, err := statedir.Watch(g.Root, name)
	if err != nil {
		return Left{}, err
	}
	defer h.Close()
	if !h.Gone() {
		return Left{}, os.ErrNotExist
	}
	l := Left{Dir: g.EntryDir(name)}
	if data, err := statedir.ReadRecord(g.Root, name, shimFile, MaxShimRecord); err == nil {
		if rec, err := DecodeShimRecord(data); err == nil {
			l.Record = &rec
		}
	}
	return l, nil
}

// RemoveLeftover removes name's entry if no shim holds it and no reader
// pins it (what Sweep does to every dead one).
func (g *Registry) RemoveLeftover(name string) { statedir.SweepName(g.Root, name) }

// Pin keeps name's entry, and what its shim leaves there for attach, from
// being removed or taken over by another shim until the pin is closed;
// any number of readers pin one entry at once. It fails with
// os.ErrNotExist when there is no entry (or it went meanwhile).
func (g *Registry) Pin(name string) (*statedir.Pinned, error) { return statedir.Pin(g.Root, name) }

// Watched is the shim of one name as Open found it: its record, and a
// watch on its lock that sees that shim, and no later one, let go.
type Watched struct {
	Record ShimRecord
	holder *statedir.Holder
}

// Open finds the live shim of name. It fails with os.ErrNotExist when no
// shim runs it, and with ErrBadShimRecord when its record cannot be read.
func (g *Registry) Open(name string) (*Watched, error) {
	if !provider.ValidName(name) {
		return nil, fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	h, err := statedir.Watch(g.Root, name)
	if err != nil {
		return nil, err
	}
	// Read after the watch is open: while that lock is held, the record
	// at the path is its holder's (another shim of the name cannot claim
	// it), so a record read before the holder is seen gone is the one of
	// the shim watched.
	data, err := statedir.ReadRecord(g.Root, name, shimFile, MaxShimRecord)
	if h.Gone() {
		return nil, os.ErrNotExist
	}
	if err == nil {
		var rec ShimRecord
		if rec, err = DecodeShimRecord(data); err == nil && rec.Name != name {
			err = fmt.Errorf("%w: it names %q", ErrBadShimRecord, rec.Name)
		}
		if err == nil {
			return &Watched{Record: rec, holder: h}, nil
		}
	} else if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%w: %w", ErrBadShimRecord, ErrNoRecord)
	} else {
		err = fmt.Errorf("%w: %v", ErrBadShimRecord, err)
	}
	h.Close()
	return nil, err
}

// Gone reports whether the shim has let go of its entry (it exited).
func (w *Watched) Gone() bool { return w.holder.Gone() }

// Close closes the watch.
func (w *Watched) Close() { w.holder.Close() }
