package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Shells are the shells completion writes scripts for.
var Shells = []string{"bash", "zsh", "fish"}

// compFlag is one flag as completion offers it.
type compFlag struct {
	dashed, usage string
	value         bool // it takes a value (the next word): complete files
}

// compCmd is one command path as completion knows it: "run",
// "manifest verify"; "" is the program itself.
type compCmd struct {
	path, summary string
	flags         []compFlag
	// words are the names it offers for its next argument: its
	// subcommands, or the fixed words its positionals take.
	words []compWord
}

type compWord struct{ word, summary string }

// Words are the fixed words a command's positional arguments take
// (completion offers them): set on a Command by Args of the form
// "bash|zsh|fish".
func wordsOf(args string) []string {
	if !strings.Contains(args, "|") || strings.ContainsAny(args, " .[]()") {
		return nil
	}
	return strings.Split(args, "|")
}

// Table is every command path of the program with its flags, walked from
// the command table and each command's own flag set: what completion
// offers, and what its tests hold each script to.
func (p *Program) table() []compCmd {
	top := compCmd{flags: []compFlag{{dashed: "--help", usage: "print usage"}, {dashed: "--version", usage: "print the version"}}}
	var out []compCmd
	var walk func(prefix string, cmds []*Command, parent *compCmd)
	walk = func(prefix string, cmds []*Command, parent *compCmd) {
		for _, c := range cmds {
			if c.Hidden {
				continue
			}
			path := strings.TrimSpace(prefix + " " + c.Name)
			parent.words = append(parent.words, compWord{c.Name, c.Summary})
			cc := compCmd{path: path, summary: c.Summary}
			if len(c.Sub) > 0 {
				cc.flags = []compFlag{{dashed: "--help", usage: "print usage"}}
				walk(path, c.Sub, &cc)
				out = append(out, cc)
				continue
			}
			var fs *flag.FlagSet
			c.Run(nil, Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard,
				describe: func(declared *flag.FlagSet) { fs = declared }})
			if fs == nil {
				panic(fmt.Sprintf("%s %s: the command did not call cli.Parse first", p.Name, path))
			}
			for _, f := range visibleFlags(fs) {
				cc.flags = append(cc.flags, compFlag{dashed: dashed(f.Name), usage: f.Usage, value: !isBool(f)})
			}
			cc.flags = append(cc.flags, compFlag{dashed: "--help", usage: "print usage"})
			for _, w := range wordsOf(c.Args) {
				cc.words = append(cc.words, compWord{w, ""})
			}
			out = append(out, cc)
		}
	}
	walk("", p.commands(), &top)
	return append([]compCmd{top}, out...)
}

// Paths maps every command path of the program ("" for the program
// itself, "stop", "manifest verify") to the flags and words completion
// offers there, as they are written: "--grace", "-o", "bash".
func (p *Program) Paths() map[string][]string {
	out := map[string][]string{}
	for _, c := range p.table() {
		flags, _, words := c.names()
		out[c.path] = append(flags, words...)
	}
	return out
}

func completionCommand(p *Program) *Command {
	return &Command{
		Name: "completion", Args: strings.Join(Shells, "|"),
		Summary: "print a completion script for bash, zsh or fish",
		Help: fmt.Sprintf(`Prints a script that completes %[1]s's commands and flags in the shell named:
  bash: source <(%[1]s completion bash)     (or save it in /etc/bash_completion.d/%[1]s)
  zsh:  source <(%[1]s completion zsh)      (or save it as _%[1]s in a directory of $fpath)
  fish: %[1]s completion fish | source      (or save it in ~/.config/fish/completions/%[1]s.fish)
`, p.Name),
		Run: func(args []string, env Env) int {
			fs := FlagSet(p.Name + " completion")
			args, code, ok := Parse(fs, args, env)
			if !ok {
				return code
			}
			if len(args) != 1 {
				return Usagef(fs, env.Stderr, "name one shell: %s", strings.Join(Shells, ", "))
			}
			switch args[0] {
			case "bash":
				p.bash(env.Stdout)
			case "zsh":
				p.zsh(env.Stdout)
			case "fish":
				p.fish(env.Stdout)
			default:
				return Usagef(fs, env.Stderr, "no completion for %q: name one of %s", args[0], strings.Join(Shells, ", "))
			}
			return 0
		},
	}
}

// funcName is the shell function name of the program: oac-shim: _oac_shim.
func (p *Program) funcName() string { return "_" + strings.ReplaceAll(p.Name, "-", "_") }

// pathCase is the case pattern that matches every command path.
func pathCase(t []compCmd) string {
	var pats []string
	for _, c := range t[1:] {
		pats = append(pats, shQuote(c.path))
	}
	return strings.Join(pats, "|")
}

// shQuote quotes s for sh, bash, zsh and fish alike (fish takes '\” in
// single quotes too).
func shQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " '\"\\$`!*?[]{}()<>|&;#~\t\n") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// summaryOf is the first line of a usage text, at most 80 characters, as
// a completion menu shows it.
func summaryOf(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = strings.TrimSpace(s[:77]) + "..."
	}
	return s
}

func (c compCmd) names() (flags, values, words []string) {
	for _, f := range c.flags {
		flags = append(flags, f.dashed)
		if f.value {
			values = append(values, f.dashed)
		}
	}
	for _, w := range c.words {
		words = append(words, w.word)
	}
	return flags, values, words
}

func (p *Program) bash(w io.Writer) {
	t := p.table()
	fn := p.funcName()
	fmt.Fprintf(w, `# bash completion for %[1]s, generated by %[1]s completion bash.
%[2]s() {
    local cur prev cmd word i flags values words
    COMPREPLY=()
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev=""
    if (( COMP_CWORD > 0 )); then prev="${COMP_WORDS[COMP_CWORD-1]}"; fi
    # The command path so far: the words before the cursor that name a
    # command, flags and their values skipped.
    cmd=""
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word="${COMP_WORDS[i]}"
        case "$word" in -*) continue ;; esac
        case "${cmd:+$cmd }$word" in
            %[3]s) cmd="${cmd:+$cmd }$word" ;;
            *) break ;;
        esac
    done
    case "$cmd" in
`, p.Name, fn, pathCase(t))
	for _, c := range t {
		flags, values, words := c.names()
		fmt.Fprintf(w, "        %s) flags=%s; values=%s; words=%s ;;\n",
			shQuote(c.path),
			shQuote(strings.Join(flags, " ")), shQuote(strings.Join(values, " ")), shQuote(strings.Join(words, " ")))
	}
	fmt.Fprintf(w, `    esac
    # A flag's value: the shell's own (file names).
    if [[ -n "$prev" && " $values " == *" $prev "* ]]; then return 0; fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=( $(compgen -W "$flags" -- "$cur") )
    elif [[ -n "$words" ]]; then
        COMPREPLY=( $(compgen -W "$words" -- "$cur") )
    fi
    return 0
}
complete -o default -F %[1]s %[2]s
`, fn, p.Name)
}

func (p *Program) zsh(w io.Writer) {
	t := p.table()
	fn := p.funcName()
	fmt.Fprintf(w, `#compdef %[1]s
# zsh completion for %[1]s, generated by %[1]s completion zsh.
%[2]s() {
    local cmd="" word i
    local -a flags values choices
    for (( i = 2; i < CURRENT; i++ )); do
        word=${words[i]}
        [[ $word == -* ]] && continue
        case "${cmd:+$cmd }$word" in
            %[3]s) cmd="${cmd:+$cmd }$word" ;;
            *) break ;;
        esac
    done
    case "$cmd" in
`, p.Name, fn, pathCase(t))
	for _, c := range t {
		var flags, choices, values []string
		for _, f := range c.flags {
			flags = append(flags, shQuote(f.dashed+":"+summaryOf(f.usage)))
			if f.value {
				values = append(values, f.dashed)
			}
		}
		for _, wd := range c.words {
			choices = append(choices, shQuote(strings.ReplaceAll(wd.word, ":", `\:`)+":"+summaryOf(wd.summary)))
		}
		pat := shQuote(c.path)
		fmt.Fprintf(w, "        %s)\n            flags=(%s)\n            values=(%s)\n            choices=(%s) ;;\n",
			pat, strings.Join(flags, " "), strings.Join(values, " "), strings.Join(choices, " "))
	}
	fmt.Fprintf(w, `    esac
    if (( CURRENT > 2 )) && (( ${values[(Ie)${words[CURRENT-1]}]} )); then
        _files
    elif [[ $PREFIX == -* ]]; then
        _describe -t flags flag flags
    elif (( ${#choices} )); then
        _describe -t commands command choices
    else
        _files
    fi
}
if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    %[1]s "$@"
else
    compdef %[1]s %[2]s
fi
`, fn, p.Name)
}

func (p *Program) fish(w io.Writer) {
	t := p.table()
	fn := "_" + p.funcName() + "_at"
	var paths []string
	for _, c := range t[1:] {
		paths = append(paths, shQuote(c.path))
	}
	fmt.Fprintf(w, `# fish completion for %[1]s, generated by %[1]s completion fish.
# %[2]s PATH: the command path before the cursor is PATH ("" for none).
function %[2]s
    set -l cmd ""
    for word in (commandline -opc)[2..-1]
        string match -q -- '-*' $word; and continue
        set -l next (string trim -- "$cmd $word")
        if contains -- $next %[3]s
            set cmd $next
        else
            break
        end
    end
    test "$cmd" = "$argv[1]"
end
`, p.Name, fn, strings.Join(paths, " "))
	for _, c := range t {
		// Command paths are words of a-z and spaces: safe in double quotes.
		cond := "'" + fn + ` "` + c.path + `"'`
		for _, wd := range c.words {
			fmt.Fprintf(w, "complete -c %s -n %s -f -a %s -d %s\n", p.Name, cond, shQuote(wd.word), shQuote(summaryOf(wd.summary)))
		}
		for _, f := range c.flags {
			opt := "-l " + strings.TrimPrefix(f.dashed, "--")
			if !strings.HasPrefix(f.dashed, "--") {
				opt = "-s " + strings.TrimPrefix(f.dashed, "-")
			}
			if f.value {
				opt += " -r"
			}
			fmt.Fprintf(w, "complete -c %s -n %s %s -d %s\n", p.Name, cond, opt, shQuote(summaryOf(f.usage)))
		}
	}
}
