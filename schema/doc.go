// Package schema publishes the JSON Schema (2020-12) files of what oac-shim
// writes and reads, and compiles them for validation: every event kind and
// control answer (event.schema.json, answer.schema.json), every control
// command (command.schema.json), the bootstrap and the private file of
// oac-sandbox-io (bootstrap.schema.json, sandbox-io.schema.json), Core's
// bootstrap shape (core-bootstrap.schema.json), the egress policy file
// (policy.schema.json), what every binary's version --json prints
// (version.schema.json), oac-image's --json reports (image-*.schema.json),
// the report of oac-shim check --json (check.schema.json) and the progress
// lines of oac-image stage (stage-progress.schema.json). Beside them,
// codes.json is the table of failure, answer and stage codes with their
// retryability, written from the Go tables by a test. docs/schema.md
// explains them.
//
// The Go types are the source of truth: the tests of this package fail when
// a type and its schema disagree (a field, its JSON type, whether it is
// always present, an event kind or failure code without schema), and the
// e2e suites validate every line a real oac-shim prints. The TypeScript
// client (clients/typescript) generates its types from these files.
//
// It must not be imported by the binaries for their own decoding: the
// strict decoders of packages bootstrap, control and egress decide what is
// accepted; the schema describes it.
package schema
