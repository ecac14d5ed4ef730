package provider

import (
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Driver is one kind of provider as oac-shim knows it. Each provider
// package registers its Driver from init; oac-shim imports the packages
// for that alone and knows none of their settings.
type Driver struct {
	// Name is the provider's name as given to --provider.
	Name string
	// Usage lists the driver's flags for oac-shim's usage text, one line
	// each after the first, as "[--flag VALUE]".
	Usage string
	// Flags declares the driver's own flags on fs and returns the
	// constructor that makes the provider from their values once fs is
	// parsed.
	Flags func(fs *FlagSet) (New func() Provider)
}

var (
	driversMu sync.Mutex
	drivers   = map[string]Driver{}
)

// Register makes a driver known. It panics on an empty or taken name.
func Register(d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d.Name == "" || d.Flags == nil {
		panic("provider: Register of a driver without a name or flags")
	}
	if _, dup := drivers[d.Name]; dup {
		panic("provider: driver " + d.Name + " registered twice")
	}
	drivers[d.Name] = d
}

// Unregister forgets a driver (tests register drivers of their own).
func Unregister(name string) {
	driversMu.Lock()
	defer driversMu.Unlock()
	delete(drivers, name)
}

// Drivers returns the registered drivers ordered by name.
func Drivers() []Driver {
	driversMu.Lock()
	defer driversMu.Unlock()
	out := make([]Driver, 0, len(drivers))
	for _, d := range drivers {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names returns the registered drivers' names in order.
func Names() []string {
	var names []string
	for _, d := range Drivers() {
		names = append(names, d.Name)
	}
	return names
}

// FlagSet is the flag set of oac-shim run and check as drivers see it.
// Drivers may declare the same flag (qemu and vz both take --kernel): it
// is defined once, with the same type and default, its usage names each
// driver, and every declarer reads the one value.
type FlagSet struct {
	fs     *flag.FlagSet
	driver string
	shared map[string]any
}

// NewFlagSet returns a FlagSet that defines flags on fs.
func NewFlagSet(fs *flag.FlagSet) *FlagSet {
	return &FlagSet{fs: fs, shared: map[string]any{}}
}

// Declare lets every registered driver declare its flags on f and
// returns each driver's constructor by name.
func (f *FlagSet) Declare() map[string]func() Provider {
	out := map[string]func() Provider{}
	for _, d := range Drivers() {
		f.driver = d.Name
		out[d.Name] = d.Flags(f)
	}
	f.driver = ""
	return out
}

// define defines a flag, or returns the one another driver defined.
func define[T any](f *FlagSet, name, usage string, def T, add func(p *T, usage string)) *T {
	usage = f.driver + ": " + usage
	if v, ok := f.shared[name]; ok {
		p, ok := v.(*T)
		fl := f.fs.Lookup(name)
		if !ok || fl.DefValue != fmt.Sprint(def) {
			panic(fmt.Sprintf("provider: flag --%s declared twice with another type or default", name))
		}
		fl.Usage += "; " + usage
		return p
	}
	p := new(T)
	add(p, usage)
	f.shared[name] = p
	return p
}

// String declares a string flag.
func (f *FlagSet) String(name, def, usage string) *string {
	return define(f, name, usage, def, func(p *string, u string) { f.fs.StringVar(p, name, def, u) })
}

// Path declares a flag naming a host path, made absolute when it is set:
// runtimes run in other working directories (qemu and the OCI runtimes in
// /), where a relative path would name something else or nothing.
func (f *FlagSet) Path(name, usage string) *string {
	return define(f, name, usage, "", func(p *string, u string) { f.fs.Var((*pathValue)(p), name, u) })
}

// Bool declares a boolean flag.
func (f *FlagSet) Bool(name string, def bool, usage string) *bool {
	return define(f, name, usage, def, func(p *bool, u string) { f.fs.BoolVar(p, name, def, u) })
}

// Int declares an integer flag.
func (f *FlagSet) Int(name string, def int, usage string) *int {
	return define(f, name, usage, def, func(p *int, u string) { f.fs.IntVar(p, name, def, u) })
}

// Duration declares a duration flag.
func (f *FlagSet) Duration(name string, def time.Duration, usage string) *time.Duration {
	return define(f, name, usage, def, func(p *time.Duration, u string) { f.fs.DurationVar(p, name, def, u) })
}

// pathValue is a host path flag, absolute once set.
type pathValue string

func (v *pathValue) String() string { return string(*v) }
func (v *pathValue) Set(s string) error {
	*v = pathValue(AbsPath(s))
	return nil
}

// AbsPath makes a host path absolute; "" stays "" (and a path that cannot
// be made absolute stays as it is).
func AbsPath(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
