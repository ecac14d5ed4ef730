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
	for {
		attempts++
		ok, what := attempt(dctx, client, c)
		if ok {
			return Result{Attempts: attempts, Took: time.Since(start)}, nil
		}
		// An attempt cut short by the overall deadline says nothing new.
		if dctx.Err() == nil || last == "" {
			last = what
		}
		t := time.NewTimer(c.Interval)
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

// attempt makes one request; it reports success or what happened.
func attempt(ctx context.Context, client *http.Client, c Check) (bool, string) {
	rctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return false, "bad request"
	}
	req.SetBasicAuth(c.Username, c.Password)
	req.Header.Set("User-Agent", "oac-guest-health")
	resp, err := client.Do(req)
	if err != nil {
		return false, describe(err, ctx, rctx, c.Timeout)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return true, ""
	}
	return false, "HTTP " + resp.Status
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
