package persist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/strictjson"
)

// SchemaVersion is the version of Record this oac-shim writes and reads.
const SchemaVersion = 1

// MaxRecordSize bounds a record file: Load refuses a larger one.
const MaxRecordSize = 1 << 20

// Sentinel errors.
var (
	// ErrNotFound: no sandbox of that name is kept here.
	ErrNotFound = errors.New("no such kept sandbox")
	// ErrLocked: another oac-shim is acting on the sandbox (running it,
	// creating it, resetting or destroying it).
	ErrLocked = errors.New("kept sandbox is in use by another oac-shim")
	// ErrCorrupt: the record cannot be read (not one the shim wrote, or
	// written by a newer oac-shim).
	ErrCorrupt = errors.New("kept sandbox record is unreadable")
)

// State is a kept sandbox's last state (the published api.KeptState).
type State = api.KeptState

// States. Creating, Resetting and Destroying are held only while a shim
// holds the sandbox's lock: found with the lock free, they are what a
// shim killed half way left, and the next command discards the sandbox.
const (
	StateCreating   = api.KeptCreating
	StateCreated    = api.KeptCreated
	StateRunning    = api.KeptRunning
	StateStopped    = api.KeptStopped
	StateFailed     = api.KeptFailed
	StateResetting  = api.KeptResetting
	StateDestroying = api.KeptDestroying
)

// States lists every State.
var States = api.KeptStates

// validState reports whether s is one of States.
func validState(s State) bool { return slices.Contains(States, s) }

// Unfinished reports whether s is a state only a shim holding the lock
// may leave a record in (see StateCreating).
func Unfinished(s State) bool {
	return s == StateCreating || s == StateResetting || s == StateDestroying
}

// Record is what the shim keeps about one sandbox.
type Record struct {
	// Schema is SchemaVersion.
	Schema int `json:"schema"`
	// Name is the sandbox's name (provider.ValidName).
	Name string `json:"name"`
	// Provider is the provider's name, as given to --provider.
	Provider string `json:"provider"`
	// Image is what the sandbox was created from.
	Image Image `json:"image"`
	// Flags are the create flags needed to start it again.
	Flags Flags `json:"flags"`
	// Created is when it was created (or last reset); LastStarted when it
	// was last started (nil: never).
	Created     time.Time  `json:"created"`
	LastStarted *time.Time `json:"last_started,omitempty"`
	// State is its last state; Message says why when it failed.
	State   State  `json:"state"`
	Message string `json:"message,omitempty"`
}

// Image identifies what a sandbox was created from.
type Image struct {
	// Ref is what the user named: a --rootfs path, a provider's image
	// flag, or "host" for a provider's default root (the host's own
	// directories, which a kept sandbox always sees as they are now).
	Ref string `json:"ref"`
	// Digest is "sha256:HEX" of the image (see Digest); "" when the image
	// has none (the host's default root).
	Digest string `json:"digest,omitempty"`
}

// Flags are the create flags a kept sandbox starts with again.
type Flags struct {
	Rootfs    string            `json:"rootfs,omitempty"`
	SandboxIO string            `json:"sandbox_io,omitempty"`
	Install   map[string]string `json:"install,omitempty"`
	// Provider are the provider's own flags that were given, as
	// "--NAME=VALUE", in the order the flag package visits them.
	Provider []string `json:"provider,omitempty"`
}

// Validate checks what Load and Save rely on.
func (r *Record) Validate() error {
	switch {
	case r.Schema != SchemaVersion:
		return fmt.Errorf("%w: schema version %d (this oac-shim reads %d; a newer oac-shim wrote it)", ErrCorrupt, r.Schema, SchemaVersion)
	case !provider.ValidName(r.Name):
		return fmt.Errorf("%w: invalid sandbox name", ErrCorrupt)
	case r.Provider == "":
		return fmt.Errorf("%w: no provider", ErrCorrupt)
	case !validState(r.State):
		return fmt.Errorf("%w: unknown state %q", ErrCorrupt, r.State)
	case r.Created.IsZero():
		return fmt.Errorf("%w: no creation time", ErrCorrupt)
	}
	return nil
}

var recordSchema = func() *strictjson.Schema {
	s := strictjson.ForType(reflect.TypeFor[Record]())
	for i := range s.Fields {
		switch s.Fields[i].Name {
		case "schema", "name", "provider", "image", "flags", "created", "state":
			s.Fields[i].Required = true
		}
	}
	return s
}()

// Decode reads a record strictly: exactly the fields of Record (the
// required ones present), nothing repeated, nothing after it.
func Decode(data []byte, name string) (Record, error) {
	var r Record
	if len(data) > MaxRecordSize {
		return r, fmt.Errorf("%w: larger than %d bytes", ErrCorrupt, MaxRecordSize)
	}
	if err := strictjson.Check(data, recordSchema); err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if err := r.Validate(); err != nil {
		return r, err
	}
	if r.Name != name {
		return r, fmt.Errorf("%w: the record names %q, not %q", ErrCorrupt, r.Name, name)
	}
	return r, nil
}

// Encode is the record file's content.
func Encode(r Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func checkName(name string) error {
	if !provider.ValidName(name) {
		return fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	return nil
}

// Store keeps the records of kept sandboxes. Its methods are safe for
// concurrent use; the commands acting on one sandbox hold its Lock.
type Store interface {
	// Lock takes the sandbox's exclusive lock without waiting: an error
	// wrapping ErrLocked when another shim holds it. The lock is dropped
	// by Unlock, or when the process dies.
	Lock(name string) (Unlocker, error)
	// Held reports whether another holder has the sandbox's lock now.
	Held(name string) bool
	// Load returns the sandbox's record: an error wrapping ErrNotFound
	// when there is none, ErrCorrupt when it cannot be read.
	Load(name string) (Record, error)
	// Save writes the record atomically (the caller holds the lock).
	Save(r Record) error
	// Remove removes every byte kept for the sandbox (record, state
	// directory, the directory itself); the caller holds the lock, which
	// ends with it. Removing what is not there is not an error.
	Remove(name string) error
	// List returns the names of the kept sandboxes, sorted.
	List() ([]string, error)
	// Exists reports whether anything is kept under the name (a record,
	// or the directory a killed command left).
	Exists(name string) bool
	// Dir is the provider's state directory of the sandbox
	// (provider.Keep.Dir), created 0700 on first use by Lock.
	Dir(name string) string
}

// Unlocker drops a lock.
type Unlocker interface{ Unlock() }
