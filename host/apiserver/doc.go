// Package apiserver serves oac-shim's control API (the schema is package
// api): commands as JSON lines on stdin or on a unix socket (0600), one
// answer per command as one JSON object per line.
//
// It owns the line framing, the answers' envelope as it is written, and
// the socket's connection limit. What a command does is the Handler's.
//
// It must not act on a command itself, echo a rejected line back (errors
// name the rule, not the value), or let a slow or hostile client block
// the shim: lines are bounded, connections are capped, and an answer
// write that fails ends only that connection.
package apiserver
