package health

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const password = "SECRET-pass-0123456789"

func check(url string) Check {
	return Check{URL: url + "/global/health", Username: "runtime", Password: password,
		Interval: 5 * time.Millisecond, Timeout: time.Second, Deadline: 10 * time.Second}
}

// server answers 503 until healthyAfter requests were made, then 200, and
// only with the right Basic credentials.
func server(t *testing.T, healthyAfter int32) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != "runtime" || p != password {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/global/health" || r.Method != http.MethodGet {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if n.Add(1) < healthyAfter {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"healthy":true}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestWaitReturnsOnceHealthy(t *testing.T) {
	srv, n := server(t, 3)
	res, err := Wait(context.Background(), check(srv.URL))
	require.NoError(t, err)
	assert.Equal(t, 3, res.Attempts)
	assert.Equal(t, int32(3), n.Load())
}

func TestWrongCredentialsNeverBecomeHealthyAndTheMessageSaysWhatWasTried(t *testing.T) {
	srv, _ := server(t, 1)
	c := check(srv.URL)
	c.Password = "SECRET-wrong-password"
	c.Deadline = 100 * time.Millisecond
	_, err := Wait(context.Background(), c)
	require.ErrorIs(t, err, ErrUnhealthy)
	msg := err.Error()
	assert.Contains(t, msg, "daemon not healthy within 100ms: tried GET "+srv.URL+"/global/health with Basic auth as \"runtime\" every 5ms (1s per request)")
	assert.Contains(t, msg, "last: HTTP 401 Unauthorized")
	assert.NotContains(t, msg, "SECRET", "the password never appears")
}

func TestNothingListeningIsConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	c := check("http://" + addr)
	c.Deadline = 50 * time.Millisecond
	_, err = Wait(context.Background(), c)
	require.ErrorIs(t, err, ErrUnhealthy)
	assert.Contains(t, err.Error(), "last: connection refused")
	assert.NotContains(t, err.Error(), "SECRET")
}

func TestASlowAnswerIsBoundedByThePerRequestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := check(srv.URL)
	c.Timeout = 20 * time.Millisecond
	c.Deadline = 200 * time.Millisecond
	res, err := Wait(context.Background(), c)
	require.ErrorIs(t, err, ErrUnhealthy)
	assert.Contains(t, err.Error(), "last: no answer within 20ms")
	assert.Greater(t, res.Attempts, 1, "a hung request does not use up the whole deadline")
}

func TestRedirectIsNotHealthy(t *testing.T) {
	srv := httptest.NewServer(http.RedirectHandler("http://example.invalid/", http.StatusFound))
	defer srv.Close()
	c := check(srv.URL)
	c.Deadline = 30 * time.Millisecond
	_, err := Wait(context.Background(), c)
	require.ErrorIs(t, err, ErrUnhealthy)
	assert.Contains(t, err.Error(), "last: HTTP 302 Found")
}

func TestCancelStopsWaiting(t *testing.T) {
	srv, _ := server(t, 1<<30)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel(errDaemonExited) }()
	_, err := Wait(ctx, check(srv.URL))
	require.ErrorIs(t, err, errDaemonExited)
	assert.NotErrorIs(t, err, ErrUnhealthy)
	assert.True(t, strings.HasPrefix(err.Error(), "health check stopped after "))
}

var errDaemonExited = &exitErr{}

type exitErr struct{}

func (*exitErr) Error() string { return "daemon exited" }

func TestCredentialsInTheURLAreRefused(t *testing.T) {
	_, err := Wait(context.Background(), Check{URL: "http://u:SECRET@127.0.0.1:1/", Deadline: time.Second})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "SECRET")
}

func TestWhileNothingListensItAsksAgainSoonerThenAtTheInterval(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	var waits []time.Duration
	newTimer = func(d time.Duration) *time.Timer {
		waits = append(waits, d)
		if len(waits) == 8 {
			// The daemon listens from now on, and answers 503 once.
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if len(waits) < 9 {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			})}
			l, err := net.Listen("tcp", addr)
			require.NoError(t, err)
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { srv.Close() })
		}
		return time.NewTimer(0)
	}
	t.Cleanup(func() { newTimer = time.NewTimer })
	c := check("http://" + addr)
	c.Interval = 100 * time.Millisecond
	c.Deadline = time.Minute
	res, err := Wait(context.Background(), c)
	require.NoError(t, err)
	assert.Equal(t, 10, res.Attempts)
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, 100 * ms, 100 * ms, 100 * ms}, waits,
		"refused: 2 ms, doubling up to the interval; an answer (503): the interval")
}
