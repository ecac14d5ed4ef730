// Package cli is the one command-line parser of oac-shim, oac-image,
// oac-guest and oac-bench: a program's command table (Program, Command),
// flags accepted before or after the positional arguments (Parse), the
// sandbox name given the same way to every command that takes one
// (Name, Names: a positional NAME, or --name where a command had it), -h
// and --help printing usage on stdout with exit status 0 and usage errors
// on stderr with 2, `version [--json]` and `--version`, and shell
// completion for bash, zsh and fish generated from the same table and the
// commands' own flag sets.
//
// It owns parsing and the shape of help only: each command declares its
// own flags (in its own package, where they were) and does its own work.
package cli
