package persist

import (
	"fmt"
	"slices"
	"sync"
)

// Mem is an in-memory Store for tests. Dir returns DirRoot/NAME (nothing
// is created on disk).
type Mem struct {
	DirRoot string

	mu      sync.Mutex
	records map[string][]byte
	held    map[string]bool
	known   map[string]bool
}

// NewMem returns an empty Mem.
func NewMem(dirRoot string) *Mem {
	return &Mem{DirRoot: dirRoot, records: map[string][]byte{}, held: map[string]bool{}, known: map[string]bool{}}
}

type memLock struct {
	m    *Mem
	name string
	once sync.Once
}

func (l *memLock) Unlock() {
	l.once.Do(func() {
		l.m.mu.Lock()
		defer l.m.mu.Unlock()
		delete(l.m.held, l.name)
	})
}

// Lock implements Store.
func (m *Mem) Lock(name string) (Unlocker, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[name] {
		return nil, fmt.Errorf("%w: %s", ErrLocked, name)
	}
	m.held[name] = true
	m.known[name] = true
	return &memLock{m: m, name: name}, nil
}

// Exists implements Store.
func (m *Mem) Exists(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.known[name]
}

// Held implements Store.
func (m *Mem) Held(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[name]
}

// Load implements Store (through Decode, as the file store does).
func (m *Mem) Load(name string) (Record, error) {
	m.mu.Lock()
	data, ok := m.records[name]
	m.mu.Unlock()
	if !ok {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return Decode(data, name)
}

// Save implements Store.
func (m *Mem) Save(r Record) error {
	data, err := Encode(r)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[r.Name] = data
	m.known[r.Name] = true
	return nil
}

// Remove implements Store.
func (m *Mem) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.records, name)
	delete(m.known, name)
	return nil
}

// List implements Store.
func (m *Mem) List() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for n := range m.known {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// Dir implements Store.
func (m *Mem) Dir(name string) string { return m.DirRoot + "/" + name }
