// Package api is the published schema of oac-shim's output and control
// API, the one its callers (TypeScript programs, client) code
// against: the events, one JSON object per line (Event, the event kinds,
// the lifecycle State), the control commands and their strict decoder
// (Command, Decode: at most MaxLine bytes a line; exactly one JSON
// object; only the keys the command takes, each once, exactly as written;
// values of the documented types; nothing after the object), the answers
// (Answer and each command's result, Status, ForwardInfo), and the sinks
// that write events as JSON lines, the failure codes a failed state carries
// with what each means to a caller (Failures: exit status, HTTP status,
// action), the answer codes a refused or failed command's answer carries
// (AnswerCodes; CommandError, Refuse and AnswerCode mark and read them on
// errors), and SchemaVersion, which every line carries, with Seq, the
// line's number on its events output, which the sink sets. The JSON Schema
// files in schema/ describe the same JSON, and their tests hold the two
// together. docs/events-and-control.md and docs/schema.md document it.
//
// It is a leaf: it imports nothing of the host (only protocol's state
// names), so a parent's client depends on the schema alone. It must not
// decide anything about sandboxes, serve the API (package apiserver) or
// run the lifecycle (package lifecycle).
package api
