package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Env is what a command reads and writes, and how its Parse says usage.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Usage writes the command's help for fs (set by Program.Main for
	// each command; default: the usage line and the flags).
	Usage func(w io.Writer, fs *flag.FlagSet)
	// describe, set by completion, takes the flag set the command
	// declared: Parse hands it over and the command returns unrun.
	describe func(fs *flag.FlagSet)
}

// Command is one command of a program's table.
type Command struct {
	Name string
	// Args is how its positional arguments read in usage, such as "NAME"
	// or "(NAME... | --all)"; empty: it takes none.
	Args string
	// Summary is its line in the program's command list.
	Summary string
	// Help is what COMMAND --help says after the usage line (optional).
	Help string
	// Run runs the command with its arguments (after its name) and
	// returns the exit status. It declares its flags on a flag set of its
	// own and calls Parse before it does anything else: completion runs
	// it to read the flags, and Parse returns it unrun then.
	Run func(args []string, env Env) int
	// Sub are its subcommands (oac-image manifest verify); a command with
	// Sub has no Run.
	Sub []*Command
	// Hidden commands run but are neither listed nor completed.
	Hidden bool
}

// Program is one binary's command table.
type Program struct {
	Name string
	// Help is what PROGRAM --help says after the command list (optional).
	Help     string
	Commands []*Command
}

// commands is the table with the commands every program has: version
// and completion.
func (p *Program) commands() []*Command {
	out := append([]*Command{}, p.Commands...)
	return append(out, versionCommand(p.Name), completionCommand(p))
}

func find(cmds []*Command, name string) *Command {
	for _, c := range cmds {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// Main runs the program with args (without the program name) and returns
// its exit status.
func (p *Program) Main(args []string, env Env) int {
	cmds := p.commands()
	if len(args) == 0 {
		p.usage(env.Stderr)
		return 2
	}
	switch a := args[0]; {
	case a == "--version" || a == "-version":
		return p.run(find(cmds, "version"), p.Name+" version", args[1:], env)
	case isHelp(a):
		if len(args) == 1 {
			p.usage(env.Stdout)
			return 0
		}
		// help COMMAND [SUB]: that command's help.
		return p.Main(append(args[1:], "--help"), env)
	}
	c := find(cmds, args[0])
	if c == nil {
		fmt.Fprintf(env.Stderr, "%s: unknown command %q (%s --help lists them)\n", p.Name, args[0], p.Name)
		return 2
	}
	return p.run(c, p.Name+" "+c.Name, args[1:], env)
}

// run parses args for c (path is how usage names it) and runs it.
func (p *Program) run(c *Command, path string, args []string, env Env) int {
	if len(c.Sub) > 0 {
		switch {
		case len(args) == 0:
			commandUsage(env.Stderr, c, path, nil)
			return 2
		case isHelp(args[0]):
			commandUsage(env.Stdout, c, path, nil)
			return 0
		}
		sub := find(c.Sub, args[0])
		if sub == nil {
			fmt.Fprintf(env.Stderr, "%s: unknown command %q (%s --help lists them)\n", path, args[0], path)
			return 2
		}
		return p.run(sub, path+" "+sub.Name, args[1:], env)
	}
	env.Usage = func(w io.Writer, fs *flag.FlagSet) { commandUsage(w, c, path, fs) }
	return c.Run(args, env)
}

// FlagSet is a command's flag set, named path ("oac-shim stop"), as Parse
// wants it.
func FlagSet(path string) *flag.FlagSet { return flag.NewFlagSet(path, flag.ContinueOnError) }

// Parse parses args into fs, flags before or after the positional
// arguments (a lone "--" ends the flags), and returns the positional
// arguments in order; ok says the command goes on. -h, -help or --help
// print the command's usage to stdout: not ok, code 0. A usage error is
// said on stderr: not ok, code 2.
func Parse(fs *flag.FlagSet, args []string, env Env) (pos []string, code int, ok bool) {
	if env.describe != nil {
		env.describe(fs)
		return nil, 0, false
	}
	// The flag package would print its errors and usage itself, on
	// whatever output the command set; both are said here instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	pos = []string{}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			if env.Usage != nil {
				env.Usage(env.Stdout, fs)
			} else {
				fmt.Fprintf(env.Stdout, "usage: %s [flags]\n\nflags:\n", fs.Name())
				PrintFlags(env.Stdout, fs)
			}
			return nil, 0, false
		}
		if err != nil {
			fmt.Fprintf(env.Stderr, "%s: %v (%s --help says what it takes)\n", fs.Name(), err, fs.Name())
			return nil, 2, false
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), 0, true
		}
		if len(rest) == 0 {
			return pos, 0, true
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// Usagef says a usage error of the command fs parses on stderr and
// returns its exit status, 2.
func Usagef(fs *flag.FlagSet, stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	return 2
}

// ErrNoName: a command that takes a sandbox's NAME was given none.
var ErrNoName = errors.New("the sandbox's NAME is required")

// Name returns the one sandbox name given to a command that takes NAME:
// its positional argument, or its --name flag where the command has one
// (callers that pass --name keep working). Given both, they must be the
// same. Given neither, ErrNoName.
func Name(fs *flag.FlagSet, args []string) (string, error) {
	names, err := Names(fs, args)
	switch {
	case err != nil:
		return "", err
	case len(names) == 0:
		return "", ErrNoName
	case len(names) > 1:
		return "", fmt.Errorf("takes one NAME, not %d (%s)", len(names), strings.Join(names, " "))
	}
	return names[0], nil
}

// Names returns the sandbox names given to a command that takes NAME...:
// its positional arguments, or its --name flag. Given both, --name must
// be the one positional NAME.
func Names(fs *flag.FlagSet, args []string) ([]string, error) {
	flagName := ""
	if f := fs.Lookup("name"); f != nil {
		flagName = f.Value.String()
	}
	switch {
	case flagName == "":
		return args, nil
	case len(args) == 0:
		return []string{flagName}, nil
	case len(args) == 1 && args[0] == flagName:
		return args, nil
	}
	return nil, fmt.Errorf("NAME %s and --name %s differ: give the name once", strings.Join(args, " "), flagName)
}

// visibleFlags are fs's flags in name order.
func visibleFlags(fs *flag.FlagSet) []*flag.Flag {
	var out []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f) })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// dashed is how a flag is written: -o for one letter, else --name.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// isBool says whether a flag takes no value.
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
