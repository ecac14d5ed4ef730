package systemd

import (
	"bytes"
	"context"
	"log/slog"
	"sync"

	"github.com/coreos/go-systemd/v22/journal"
)

// JournalHandler returns a slog handler that sends each record to the
// journal with its priority, when stderr is connected to the journal
// (JOURNAL_STREAM), and nil otherwise. ident is SYSLOG_IDENTIFIER.
func JournalHandler(ident string, level slog.Leveler) slog.Handler {
	ok, err := journal.StderrIsJournalStream()
	if err != nil || !ok || !journal.Enabled() {
		return nil
	}
	return newJournalHandler(ident, level, journal.Send)
}

type sendFunc func(message string, priority journal.Priority, vars map[string]string) error

// journalHandler formats records like the text handler (without time and
// level, which the journal has) and sends them.
type journalHandler struct {
	inner slog.Handler
	out   *recordBuf
	ident string
	send  sendFunc
}

type recordBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *recordBuf) Write(p []byte) (int, error) { return b.buf.Write(p) }

func newJournalHandler(ident string, level slog.Leveler, send sendFunc) *journalHandler {
	out := &recordBuf{}
	inner := slog.NewTextHandler(out, &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
			return slog.Attr{}
		}
		return a
	}})
	return &journalHandler{inner: inner, out: out, ident: ident, send: send}
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	}
	return journal.PriDebug
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.out.mu.Lock()
	h.out.buf.Reset()
	err := h.inner.Handle(ctx, r)
	msg := string(bytes.TrimRight(h.out.buf.Bytes(), "\n"))
	h.out.mu.Unlock()
	if err != nil {
		return err
	}
	return h.send(msg, priority(r.Level), map[string]string{"SYSLOG_IDENTIFIER": h.ident})
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.inner = h.inner.WithAttrs(as)
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.inner = h.inner.WithGroup(name)
	return &c
}
