package systemd

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// notifySocket listens like systemd's notify socket and returns the
// messages it receives.
func notifySocket(t *testing.T) (<-chan string, func()) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Setenv("NOTIFY_SOCKET", path)
	ch := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				close(ch)
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return ch, func() { c.Close(); <-done }
}

func recv(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no sd_notify message")
		return ""
	}
}

func TestNotifierSendsStatusReadyOnceAndStopping(t *testing.T) {
	ch, stop := notifySocket(t)
	defer stop()
	n := NewNotifier(nil)
	require.True(t, n.Enabled())
	n.Status("starting: creating sandbox")
	assert.Equal(t, "STATUS=starting: creating sandbox", recv(t, ch))
	n.Ready("ready: http://127.0.0.1:8080\nsecond line")
	assert.Equal(t, "READY=1\nSTATUS=ready: http://127.0.0.1:8080 second line", recv(t, ch))
	n.Ready("ready again")
	assert.Equal(t, "STATUS=ready again", recv(t, ch), "READY=1 only once")
	n.Stopping("stopping: received terminated")
	assert.Equal(t, "STOPPING=1\nSTATUS=stopping: received terminated", recv(t, ch))
}

func TestWatchdogPingsAtHalfTheInterval(t *testing.T) {
	ch, stop := notifySocket(t)
	defer stop()
	t.Setenv("WATCHDOG_USEC", "40000")
	t.Setenv("WATCHDOG_PID", "")
	n := NewNotifier(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Watchdog(ctx, func() bool { return true }); close(done) }()
	assert.Equal(t, "WATCHDOG=1", recv(t, ch))
	assert.Equal(t, "WATCHDOG=1", recv(t, ch))
	cancel()
	<-done
}

func TestWatchdogIsOffForAnotherPidAndWhenUnset(t *testing.T) {
	_, stop := notifySocket(t)
	defer stop()
	n := NewNotifier(nil)
	t.Setenv("WATCHDOG_USEC", "")
	n.Watchdog(context.Background(), nil) // returns at once
	t.Setenv("WATCHDOG_USEC", "40000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(1))
	n.Watchdog(context.Background(), nil) // not ours: returns at once
}

func TestWithoutNotifySocketNothingHappens(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := NewNotifier(nil)
	assert.False(t, n.Enabled())
	n.Ready("x")
	n.Status("x")
	n.Stopping("x")
	n.Watchdog(context.Background(), nil)
}

func TestJournalHandlerSendsPriorityAndText(t *testing.T) {
	type sent struct {
		msg  string
		prio journal.Priority
		vars map[string]string
	}
	var mu sync.Mutex
	var got []sent
	h := newJournalHandler("oac-shim", slog.LevelInfo, func(m string, p journal.Priority, v map[string]string) error {
		mu.Lock()
		got = append(got, sent{m, p, v})
		mu.Unlock()
		return nil
	})
	log := slog.New(h).With("component", "oac-shim")
	log.Info("sandbox ready", "url", "http://127.0.0.1:1")
	log.Warn("slow")
	log.Error("failed", "err", "boom")
	log.Debug("hidden")
	require.Len(t, got, 3)
	assert.Equal(t, `msg="sandbox ready" component=oac-shim url=http://127.0.0.1:1`, got[0].msg)
	assert.Equal(t, journal.PriInfo, got[0].prio)
	assert.Equal(t, journal.PriWarning, got[1].prio)
	assert.Equal(t, journal.PriErr, got[2].prio)
	assert.Equal(t, "oac-shim", got[0].vars["SYSLOG_IDENTIFIER"])
	assert.Nil(t, JournalHandler("x", slog.LevelInfo), "stderr is not the journal in tests")
}
