package systemd

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/oac/sandbox-agent/internal/safetext"
)

// Notifier sends sd_notify messages when NOTIFY_SOCKET is set.
type Notifier struct {
	enabled bool
	log     *slog.Logger

	mu     sync.Mutex
	ready  bool
	warned bool
}

// NewNotifier returns a notifier for this process; it does nothing when
// NOTIFY_SOCKET is not set.
func NewNotifier(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{enabled: os.Getenv("NOTIFY_SOCKET") != "", log: log}
}

// Enabled reports whether a service manager listens.
func (n *Notifier) Enabled() bool { return n != nil && n.enabled }

func (n *Notifier) send(state string) {
	if !n.Enabled() {
		return
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.mu.Lock()
		warned := n.warned
		n.warned = true
		n.mu.Unlock()
		if !warned {
			n.log.Warn("sd_notify failed", "err", err)
		}
	}
}

// statusText makes s one bounded line for STATUS=.
func statusText(s string) string { return safetext.Clean(s, 200, ' ') }

// Status sets the service's status line.
func (n *Notifier) Status(s string) { n.send("STATUS=" + statusText(s)) }

// Ready says the service is ready (once; later calls update the status
// only).
func (n *Notifier) Ready(status string) {
	if !n.Enabled() {
		return
	}
	n.mu.Lock()
	first := !n.ready
	n.ready = true
	n.mu.Unlock()
	if first {
		n.send(daemon.SdNotifyReady + "\nSTATUS=" + statusText(status))
		return
	}
	n.Status(status)
}

// Stopping says an orderly stop has begun.
func (n *Notifier) Stopping(status string) {
	n.send(daemon.SdNotifyStopping + "\nSTATUS=" + statusText(status))
}

// Watchdog pings the watchdog at half its interval until ctx ends, when
// WATCHDOG_USEC is set for this process. It returns at once otherwise.
// alive, when set, is asked before each ping: a false answer skips it, so
// a wedged service is restarted.
func (n *Notifier) Watchdog(ctx context.Context, alive func() bool) {
	if !n.Enabled() {
		return
	}
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("watchdog settings", "err", err)
		return
	}
	if every <= 0 {
		return
	}
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		if alive == nil || alive() {
			n.send(daemon.SdNotifyWatchdog)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
