// Package yamux is github.com/hashicorp/yamux v0.1.2 (MPL-2.0, LICENSE in
// this directory), carried here with one change, so that every yamux
// session of the project (the shim's, the guest agent's, the tests' and
// the benchmarks') has it.
//
// The change: a stream blocked in Read or Write returns
// ErrSessionShutdown once its session shuts down. Upstream, the wait
// wakes on the closed shutdown channel and retries without blocking
// until Session.Close reaches the stream and marks it closed, which it
// does only after the receive loop returned. With 256 egress streams and
// a loaded machine, the shim's stop spent 2 s of CPU in those retries
// (the streams' state locks starved the one goroutine closing them) and
// missed its bound (e2e TestShimMemoryStaysUnderTheCeiling). The same
// fix is proposed upstream as hashicorp/yamux pull request 176; once a
// release has it, this package goes and the imports return to upstream.
//
// It owns the yamux wire and session only; what a guest may send is
// checked before yamux sees it (host/muxguard), and the project's limits
// are set in protocol.MuxConfig.
package yamux
