// Package muxinject lets a test guest send yamux frames its yamux session
// never would (a wrapping window update, a ping flood) on the same
// transport, between the session's own frames: the hostile guests of the
// tests use it. It owns nothing else and must never be used by oac-guest.
package muxinject
