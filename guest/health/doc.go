// Package health polls the daemon's health endpoint from inside the guest:
// GET with HTTP Basic auth every interval, each request bounded by its own
// timeout, until a 2xx answer or the overall deadline. While the connect is
// refused (the daemon does not listen yet) it asks again sooner: 2 ms after
// the first refusal, twice as late after each next one, up to the interval. The daemon listens
// on the guest's loopback, which the host cannot reach, so the agent polls
// and reports ready.
//
// It owns the polling and the failure message, which says what was tried
// (method, URL, user, interval, per-request timeout, attempts, last result).
// It must never put the password in a URL, an error or a log line, never use
// a proxy from the environment, and never follow a redirect.
package health
