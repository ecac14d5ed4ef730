package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// usage is PROGRAM --help: the command list, then the program's Help.
func (p *Program) usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s COMMAND [flags] [arguments]   (flags go before or after the arguments)\n\ncommands:\n", p.Name)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range p.commands() {
		if c.Hidden {
			continue
		}
		if len(c.Sub) == 0 {
			fmt.Fprintf(tw, "  %s\t%s\n", synopsis(c.Name, c.Args), c.Summary)
			continue
		}
		for _, s := range c.Sub {
			fmt.Fprintf(tw, "  %s\t%s\n", synopsis(c.Name+" "+s.Name, s.Args), s.Summary)
		}
	}
	_ = tw.Flush()
	if p.Help != "" {
		fmt.Fprintf(w, "\n%s", strings.TrimLeft(p.Help, "\n"))
		if !strings.HasSuffix(p.Help, "\n") {
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\n%s COMMAND --help says what a command does and takes; %s --version prints the version.\n", p.Name, p.Name)
}

func synopsis(name, args string) string {
	if args == "" {
		return name
	}
	return name + " " + args
}

// commandUsage is COMMAND --help: the usage line, the command's Help and
// its flags (fs nil: a command with subcommands, listed instead).
func commandUsage(w io.Writer, c *Command, path string, fs *flag.FlagSet) {
	if len(c.Sub) > 0 {
		fmt.Fprintf(w, "usage: %s COMMAND\n", path)
		if c.Summary != "" {
			fmt.Fprintf(w, "\n%s\n", c.Summary)
		}
		fmt.Fprintln(w, "\ncommands:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, s := range c.Sub {
			fmt.Fprintf(tw, "  %s\t%s\n", synopsis(s.Name, s.Args), s.Summary)
		}
		_ = tw.Flush()
		if c.Help != "" {
			fmt.Fprintf(w, "\n%s", c.Help)
		}
		return
	}
	// A Help that starts with its own usage lines replaces the generated one.
	if !strings.HasPrefix(c.Help, "usage:") {
		flags := ""
		if len(visibleFlags(fs)) > 0 {
			flags = " [flags]"
		}
		fmt.Fprintf(w, "usage: %s%s", path, flags)
		if c.Args != "" {
			fmt.Fprintf(w, " %s", c.Args)
		}
		fmt.Fprintln(w)
	}
	switch {
	case strings.HasPrefix(c.Help, "usage:"):
		fmt.Fprint(w, c.Help)
	case c.Help != "":
		fmt.Fprintf(w, "\n%s", strings.TrimLeft(c.Help, "\n"))
		if !strings.HasSuffix(c.Help, "\n") {
			fmt.Fprintln(w)
		}
	case c.Summary != "":
		fmt.Fprintf(w, "\n%s\n", c.Summary)
	}
	if len(visibleFlags(fs)) > 0 {
		fmt.Fprintln(w, "\nflags (before or after the arguments):")
		PrintFlags(w, fs)
	}
}

// PrintFlags lists fs's flags as --name TYPE, with usage and default, in
// name order.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	for _, f := range visibleFlags(fs) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  " + dashed(f.Name)
		if typ != "" {
			line += " " + typ
		}
		if !isZero(f) {
			usage += fmt.Sprintf(" (default %s)", defaultText(f))
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
	}
}

// isZero says whether a flag's default is its type's zero value, which
// usage does not show.
func isZero(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
		return true
	}
	return false
}

func defaultText(f *flag.Flag) string {
	if _, ok := f.Value.(interface{ Get() any }); ok {
		if _, isString := f.Value.(interface{ Get() any }).Get().(string); isString {
			return fmt.Sprintf("%q", f.DefValue)
		}
	}
	return f.DefValue
}
