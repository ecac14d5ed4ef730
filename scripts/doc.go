// Package scripts is the shell scripts the Makefile runs (deps.sh,
// node-check.sh, demo.sh, ...). It has no Go code: its tests hold the
// set-up to its promises (what make demo and make test install; the
// README's snippets being the programs the tests run).
package scripts
