// Package events defines the events oac-shim reports, one JSON object per
// line, and the sinks that write them. It owns the event schema documented
// in docs/events-and-control.md; it must not decide anything about sandboxes.
package events
