package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"
)

// ErrUnhealthy wraps the error Wait returns when the deadline passes.
var ErrUnhealthy = errors.New("daemon not healthy")

// Check is one health check.
type Check struct {
	// URL is the full URL to GET, without credentials.
	URL                string
	Username, Password string
	Interval, Timeout  time.Duration
	Deadline           time.Duration
	// Client overrides the default client (no proxy, no redirects, no
	// keep-alive).
	Client *http.Client
	// Dial, for the default client, dials the daemon (from the workload's
	// network namespace: netns.NS.DialContext); nil dials from the
	// agent's own.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Result says how a successful wait went.
type Result struct {
	Attempts int
	Took     time.Duration
}

func defaultClient(dial func(ctx context.Context, network, address string) (net.Conn, error)) *http.Client {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:             nil,
			DialContext:       dial,
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Wait polls until the endpoint answers 2xx (nil), the deadline passes (an
// error wrapping ErrUnhealthy that says what was tried) or ctx is done (its
// error, wrapped).
func Wait(ctx context.Context, c Check) (Result, error) {
	u, err := url.Parse(c.URL)
	if err != nil || u.User != nil {
		return Result{}, errors.New("health check URL must be a plain http URL without credentials")
	}
	client := c.Client
	if client == nil {
		client = defaultClient(c.Dial)
		defer client.CloseIdleConnections()
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, c.Deadline)
	defer cancel()
	var attempts int
	var last string
	refusedWait := firstRefusedWait
	for {
		attempts++
		ok, what, refused := attempt(dctx, client, c)
		if ok {
			return Result{Attempts: attempts, Took: time.Since(start)}, nil
		}
		// An attempt cut short by the overall deadline says nothing new.
		if dctx.Err() == nil || last == "" {
			last = what
		}
		// Nothing listens yet (the daemon is still starting): a refused
		// loopback connect costs microseconds, so ask again soon, twice as
		// late each time, up to the interval; a daemon that answered gets
		// the whole interval.
		wait := c.Interval
		if refused && refusedWait < wait {
			wait = refusedWait
			refusedWait *= 2
		}
		t := newTimer(wait)
		select {
		case <-t.C:
			continue
		case <-dctx.Done():
			t.Stop()
		}
		if ctx.Err() != nil {
			return Result{Attempts: attempts}, fmt.Errorf("health check stopped after %d attempts: %w", attempts, context.Cause(ctx))
		}
		return Result{Attempts: attempts}, fmt.Errorf("%w within %s: tried GET %s with Basic auth as %q every %s (%s per request), %d attempts; last: %s",
			ErrUnhealthy, c.Deadline, c.URL, c.Username, c.Interval, c.Timeout, attempts, last)
	}
}

// newTimer makes the wait between attempts (a test records the waits).
var newTimer = time.NewTimer

// firstRefusedWait is the wait after the first refused connect; it
// doubles after each one, up to Check.Interval.
const firstRefusedWait = 2 * time.Millisecond

// attempt makes one request; it reports success or what happened, and
// whether the connect was refused (nothing listens yet).
func attempt(ctx context.Context, client *http.Client, c Check) (bool, string, bool) {
	rctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return false, "bad request", false
	}
	req.SetBasicAuth(c.Username, c.Password)
	req.Header.Set("User-Agent", "oac-guest-health")
	resp, err := client.Do(req)
	if err != nil {
		return false, describe(err, ctx, rctx, c.Timeout), errors.Is(err, syscall.ECONNREFUSED)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return true, "", false
	}
	return false, "HTTP " + resp.Status, false
}

// describe names a request failure without the URL (already in the
// message) and never with credentials.
func describe(err error, ctx, rctx context.Context, timeout time.Duration) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (is the daemon listening on that port?)"
	case ctx.Err() != nil:
		return "cut short by the overall deadline"
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %s", timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Op + ": " + oe.Err.Error()
	}
	return err.Error()
}
