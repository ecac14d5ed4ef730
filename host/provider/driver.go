package provider

import (
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Driver is one kind of provider as oac-shim knows it. Each provider
// package registers its Driver from init; oac-shim imports the packages
// for that alone and knows none of their settings.
//
// A provider's settings are a struct whose fields tagged `flag:"NAME"`
// are its flags, with `usage:"..."` and, for the usage line, `meta:"..."`
// (a value's placeholder; a flag whose meta starts with "!" is shown as
// required). `flag:"NAME,path"` marks a host path, made absolute when it
// is set: runtimes run in other working directories (qemu and the OCI
// runtimes in /), where a relative path would name something else or
// nothing. Fields of embedded structs count. Two drivers may take the
// same flag (qemu and vz both take --kernel): it is defined once and
// sets both.
type Driver[T any] struct {
	// Name is the provider's name as given to --provider.
	Name string
	// Defaults are the settings before any flag is parsed (nil: zero).
	Defaults *T
	// Note ends the driver's usage line.
	Note string
	// New makes the provider from settings filled from the parsed flags:
	// it applies the defaults that depend on the host and says when the
	// provider cannot run on this OS (Unavailable).
	New func(settings *T) Provider
}

// driver is a registered Driver, its settings' type erased.
type driver struct {
	name, note string
	typ        reflect.Type
	defaults   reflect.Value // a *T
	finish     func(reflect.Value) Provider
}

var (
	driversMu sync.Mutex
	drivers   = map[string]driver{}
)

// Register makes a driver known. It panics on an empty or taken name.
func Register[T any](d Driver[T]) {
	if d.Name == "" || d.New == nil {
		panic("provider: Register of a driver without a name or constructor")
	}
	defaults := d.Defaults
	if defaults == nil {
		defaults = new(T)
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[d.Name]; dup {
		panic("provider: driver " + d.Name + " registered twice")
	}
	drivers[d.Name] = driver{
		name: d.Name, note: d.Note, typ: reflect.TypeFor[T](), defaults: reflect.ValueOf(defaults),
		finish: func(v reflect.Value) Provider { return d.New(v.Interface().(*T)) },
	}
}

// Unregister forgets a driver (tests register drivers of their own).
func Unregister(name string) {
	driversMu.Lock()
	defer driversMu.Unlock()
	delete(drivers, name)
}

func sorted() []driver {
	driversMu.Lock()
	defer driversMu.Unlock()
	out := make([]driver, 0, len(drivers))
	for _, d := range drivers {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Names returns the registered drivers' names in order.
func Names() []string {
	var names []string
	for _, d := range sorted() {
		names = append(names, d.name)
	}
	return names
}

// Usage returns each registered driver's flags as usage lines, by name.
func Usage() map[string]string {
	out := map[string]string{}
	for _, d := range sorted() {
		var parts []string
		for _, f := range flagFields(d.typ, nil) {
			parts = append(parts, f.usagePart(d.defaults.Elem().FieldByIndex(f.index)))
		}
		if d.note != "" {
			parts = append(parts, d.note)
		}
		out[d.name] = strings.Join(parts, " ")
	}
	return out
}

// Declare defines every registered driver's flags on fs and returns each
// driver's constructor by name, to call once fs is parsed.
func Declare(fs *flag.FlagSet) map[string]func() Provider {
	out := map[string]func() Provider{}
	shared := map[string]bound{}
	for _, d := range sorted() {
		settings := reflect.New(d.typ)
		settings.Elem().Set(d.defaults.Elem())
		for _, f := range flagFields(d.typ, nil) {
			target := settings.Elem().FieldByIndex(f.index)
			if v, ok := shared[f.name]; ok {
				if !v.bind(target) {
					panic(fmt.Sprintf("provider: flag --%s declared with two types", f.name))
				}
				fl := fs.Lookup(f.name)
				fl.Usage += "; " + d.name + ": " + f.usage
				continue
			}
			v := newBound(target, f.path)
			v.bind(target)
			shared[f.name] = v
			fs.Var(v, f.name, d.name+": "+f.usage)
		}
		finish := d.finish
		out[d.name] = func() Provider { return finish(settings) }
	}
	return out
}

// flagField is one field tagged `flag`.
type flagField struct {
	name, usage, meta string
	path              bool
	index             []int
}

func flagFields(t reflect.Type, index []int) []flagField {
	var out []flagField
	for i := range t.NumField() {
		sf := t.Field(i)
		idx := append(append([]int(nil), index...), i)
		if sf.Anonymous && sf.Type.Kind() == reflect.Struct {
			out = append(out, flagFields(sf.Type, idx)...)
			continue
		}
		tag, ok := sf.Tag.Lookup("flag")
		if !ok {
			continue
		}
		name, opt, _ := strings.Cut(tag, ",")
		out = append(out, flagField{name: name, usage: sf.Tag.Get("usage"), meta: sf.Tag.Get("meta"), path: opt == "path", index: idx})
	}
	return out
}

// usagePart is the flag in a usage line: "[--name META]", "--name META"
// when required, "[--name]" or "[--name=false]" for a boolean.
func (f flagField) usagePart(def reflect.Value) string {
	if def.Kind() == reflect.Bool {
		if def.Bool() {
			return "[--" + f.name + "=false]"
		}
		return "[--" + f.name + "]"
	}
	if req, ok := strings.CutPrefix(f.meta, "!"); ok {
		return "--" + f.name + " " + req
	}
	return "[--" + f.name + " " + f.meta + "]"
}

// bound is a flag that sets one field of each driver that takes it.
type bound interface {
	flag.Value
	// bind adds a field; false when its type is not the flag's.
	bind(field reflect.Value) bool
}

func newBound(field reflect.Value, path bool) bound {
	switch field.Interface().(type) {
	case time.Duration:
		return &boundValue[time.Duration]{parse: time.ParseDuration}
	case string:
		return &boundValue[string]{parse: func(s string) (string, error) {
			if path {
				s = AbsPath(s)
			}
			return s, nil
		}}
	case bool:
		return &boundValue[bool]{parse: strconv.ParseBool}
	case int:
		return &boundValue[int]{parse: func(s string) (int, error) {
			n, err := strconv.ParseInt(s, 0, strconv.IntSize)
			return int(n), err
		}}
	}
	panic(fmt.Sprintf("provider: a flag of type %s", field.Type()))
}

type boundValue[T any] struct {
	parse   func(string) (T, error)
	targets []*T
}

func (v *boundValue[T]) bind(field reflect.Value) bool {
	p, ok := field.Addr().Interface().(*T)
	if ok {
		v.targets = append(v.targets, p)
	}
	return ok
}

func (v *boundValue[T]) String() string {
	if v == nil || len(v.targets) == 0 {
		var zero T
		return fmt.Sprint(zero)
	}
	return fmt.Sprint(*v.targets[0])
}

func (v *boundValue[T]) IsBoolFlag() bool {
	_, ok := any(*new(T)).(bool)
	return ok
}

func (v *boundValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	for _, t := range v.targets {
		*t = x
	}
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
