package sandbox

import (
	"context"
	"log/slog"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/api"
)

// MemoryCeiling is the most memory (peak RSS) one sandbox's shim holds,
// whatever its guest does (docs/threat-model.md, measured by
// e2e/hostile_test.go). What enforces it: the session's receive budget
// (muxguard.DefaultRecvBudget), the big copy buffers of the process
// (pipe.MaxBigBuffers), the stream, ping and open limits (protocol's
// session bounds), the event and log rates here, and SoftMemoryLimit.
const MemoryCeiling = 64 << 20

// MemoryCeilingKubernetes is MemoryCeiling for oac-shim-kubernetes: its
// Kubernetes client library's code and tables take about 20 MiB before
// any sandbox (30.5 MiB against oac-shim's 11.5 for the same idle
// sandbox), up to 25 under load, as pages of its executable and the
// client's registered types; the sandbox's share is bounded as above.
const MemoryCeilingKubernetes = MemoryCeiling + 32<<20

// SoftMemoryLimit is the Go runtime's memory limit oac-shim sets (unless
// GOMEMLIMIT is given): the collector works harder as the heap nears it,
// so garbage does not take the process past MemoryCeiling.
const SoftMemoryLimit = 48 << 20

// Event and diagnostic rates per sandbox: what the guest can make the
// shim write is bounded like log lines are (LogRate). Over a rate,
// events are dropped and counted, and one *_dropped event a second says
// how many; state events are never dropped.
const (
	// EgressEventRate and EgressEventBurst: egress and egress_closed
	// events a second (each egress stream gives one or two).
	EgressEventRate  = 200
	EgressEventBurst = 2000
	// ProcessEventRate and ProcessEventBurst: process events a second.
	ProcessEventRate  = 20
	ProcessEventBurst = 200
	// WarnRate and WarnBurst: the shim's own warnings about what the
	// guest does (bad streams, refused streams), lines a second; a line
	// after drops carries how many were dropped.
	WarnRate  = 5
	WarnBurst = 50
)

// eventLimit is the rate of one family of events.
type eventLimit struct {
	lim     *rate.Limiter
	dropped atomic.Int64
	kind    string // the *_dropped event
	msg     string
}

func newEventLimit(r float64, burst int, kind, msg string) *eventLimit {
	return &eventLimit{lim: rate.NewLimiter(rate.Limit(r), burst), kind: kind, msg: msg}
}

// allow reports whether one more event may be emitted now.
func (l *eventLimit) allow() bool {
	if l.lim.Allow() {
		return true
	}
	l.dropped.Add(1)
	return false
}

// report emits the count dropped since the last report, if any.
func (l *eventLimit) report(emit func(api.Event)) {
	if n := l.dropped.Swap(0); n > 0 {
		emit(api.Event{Event: l.kind, Dropped: n, Message: l.msg})
	}
}

// limitedHandler passes WarnRate records a second (WarnBurst at once) and
// counts the rest; the next record passed says how many were dropped.
type limitedHandler struct {
	slog.Handler
	lim     *rate.Limiter
	dropped *atomic.Int64
}

func limitWarnings(l *slog.Logger) *slog.Logger {
	return slog.New(limitedHandler{Handler: l.Handler(), lim: rate.NewLimiter(WarnRate, WarnBurst), dropped: new(atomic.Int64)})
}

func (h limitedHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.lim.Allow() {
		h.dropped.Add(1)
		return nil
	}
	if n := h.dropped.Swap(0); n > 0 {
		r.AddAttrs(slog.Int64("dropped_before", n))
	}
	return h.Handler.Handle(ctx, r)
}

func (h limitedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return limitedHandler{Handler: h.Handler.WithAttrs(as), lim: h.lim, dropped: h.dropped}
}

func (h limitedHandler) WithGroup(name string) slog.Handler {
	return limitedHandler{Handler: h.Handler.WithGroup(name), lim: h.lim, dropped: h.dropped}
}
