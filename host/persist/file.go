package persist

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
)

// File names inside a sandbox's directory.
const (
	recordName = "record.json"
	lockName   = "lock"
	stateName  = "state"
	tempPrefix = ".record-"
)

// FileStore is the Store on the host's filesystem (see the package
// documentation for the layout).
type FileStore struct {
	// Root is the directory the sandboxes directory is in.
	Root string
}

// NewFileStore returns the store under root.
func NewFileStore(root string) *FileStore { return &FileStore{Root: root} }

func (s *FileStore) base() string { return filepath.Join(s.Root, "sandboxes") }

func (s *FileStore) dir(name string) string { return filepath.Join(s.base(), name) }

// Dir implements Store.
func (s *FileStore) Dir(name string) string { return filepath.Join(s.dir(name), stateName) }

// fileLock is a held flock on a sandbox's lock file.
type fileLock struct{ f *os.File }

func (l *fileLock) Unlock() {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// Lock implements Store. It creates the sandbox's directory (0711: the
// provider may hand state/ to the guest's root, an unprivileged host id,
// which must reach it) and its state directory (0700).
func (s *FileStore) Lock(name string) (Unlocker, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	for _, d := range []string{s.Root, s.base()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	dir := s.dir(name)
	for range 8 {
		if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		path := filepath.Join(dir, lockName)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|openFlags, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed meanwhile
			}
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		err = tryLock(f)
		if err != nil && wouldBlock(err) {
			// Held: by a command of that name, or, for a moment, by another
			// command's sweep of directories without a record, which this
			// one is about to make. Wait out a moment's hold.
			err = s.waitLock(f, name)
		}
		if err != nil {
			f.Close()
			if wouldBlock(err) {
				return nil, fmt.Errorf("%w: %s (lock %s)", ErrLocked, name, path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !sameFile(f, path) {
			f.Close() // a Remove unlinked it between our open and flock
			continue
		}
		if err := os.Mkdir(s.Dir(name), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			f.Close()
			return nil, fmt.Errorf("create %s: %w", s.Dir(name), err)
		}
		return &fileLock{f: f}, nil
	}
	return nil, fmt.Errorf("lock kept sandbox %s: it kept changing under us; retry", name)
}

// sweepHold bounds the wait for a lock held by a sweep: a sweep holds a
// name's lock only to see that it has no record and remove it.
const sweepHold = time.Second

// lockContended, when set (tests), is called each time Lock finds the
// name's lock held, before it waits.
var lockContended func(name string)

// waitLock retries the lock of f while it is held, for at most sweepHold,
// backing off from 2 ms to 100 ms; it returns the last error.
func (s *FileStore) waitLock(f *os.File, name string) error {
	deadline := time.Now().Add(sweepHold)
	backoff := 2 * time.Millisecond
	for {
		if lockContended != nil {
			lockContended(name)
		}
		err := tryLock(f)
		if err == nil || !wouldBlock(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

func sameFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Lstat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// Exists implements Store.
func (s *FileStore) Exists(name string) bool {
	if checkName(name) != nil {
		return false
	}
	_, err := os.Lstat(s.dir(name))
	return err == nil
}

// Held implements Store.
func (s *FileStore) Held(name string) bool {
	if checkName(name) != nil {
		return false
	}
	f, err := os.OpenFile(filepath.Join(s.dir(name), lockName), os.O_RDWR|openFlags, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := tryLock(f); err != nil {
		return wouldBlock(err)
	}
	unlock(f)
	return false
}

// Load implements Store. Temporary files of a torn Save are ignored.
func (s *FileStore) Load(name string) (Record, error) {
	if err := checkName(name); err != nil {
		return Record{}, err
	}
	path := filepath.Join(s.dir(name), recordName)
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Record{}, fmt.Errorf("read record of %s: %w", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxRecordSize+1))
	if err != nil {
		return Record{}, fmt.Errorf("read %s: %w", path, err)
	}
	r, err := Decode(data, name)
	if err != nil {
		return r, fmt.Errorf("%s: %w (oac-shim destroy %s removes it)", path, err, name)
	}
	return r, nil
}

// Save implements Store: a temporary file in the same directory, synced,
// renamed over the record, and the directory synced.
func (s *FileStore) Save(r Record) error {
	data, err := Encode(r)
	if err != nil {
		return err
	}
	dir := s.dir(r.Name)
	tmp, err := os.CreateTemp(dir, tempPrefix+"*.tmp")
	if err != nil {
		return fmt.Errorf("save record of %s: %w", r.Name, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("save record of %s: %w", r.Name, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("save record of %s: sync: %w", r.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save record of %s: %w", r.Name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, recordName)); err != nil {
		return fmt.Errorf("save record of %s: %w", r.Name, err)
	}
	ok = true
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("save record of %s: sync %s: %w", r.Name, dir, err)
	}
	// What an earlier Save killed half way left.
	if old, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*.tmp")); len(old) > 0 {
		for _, p := range old {
			os.Remove(p)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Remove implements Store. The lock file goes last, while still held,
// so nobody takes the name half removed.
func (s *FileStore) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	dir := s.dir(name)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove kept sandbox %s: %w", name, err)
	}
	var errs []error
	for _, e := range ents {
		if e.Name() == lockName {
			continue
		}
		if err := removeAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove kept sandbox %s: %w", name, errors.Join(errs...))
	}
	if err := os.Remove(filepath.Join(dir, lockName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Windows keeps a file another handle (our lock) has open: the
		// empty lock stays, and List does not count it.
		return nil
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove kept sandbox %s: %w", name, err)
	}
	return syncDir(s.base())
}

// removeAll is os.RemoveAll that first makes directories it cannot enter
// writable and searchable (a guest can leave a 0500 directory behind).
func removeAll(p string) error {
	if err := os.RemoveAll(p); err == nil {
		return nil
	}
	_ = filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// List implements Store: the directories holding a record or a lock
// (a create killed before its first Save leaves only the lock).
func (s *FileStore) List() ([]string, error) {
	ents, err := os.ReadDir(s.base())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list kept sandboxes: %w", err)
	}
	var names []string
	for _, e := range ents {
		if !e.IsDir() || !provider.ValidName(e.Name()) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if ents, err := os.ReadDir(s.dir(e.Name())); err == nil && len(ents) == 1 && ents[0].Name() == lockName {
			continue // removed, but for a lock Windows would not delete while held
		}
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names, nil
}
