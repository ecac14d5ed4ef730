//go:build linux

// Command badguest is a deliberately misbehaving guest agent for end-to-end
// tests: the shim boots it in a real sandbox instead of oac-guest and must
// fail cleanly, or stop within its bound, whatever it does.
//
//	--mode version   speak protocol versions 2..3 (the host speaks 1..1)
//	--mode garbage   write bytes that are not a yamux session
//
// The hostile modes complete the handshake, report ready, then:
//
//	--mode window    send a window update that wraps the control stream's send window
//	--mode pings     flood yamux pings
//	--mode streams   open and reset streams as fast as the transport carries
//	--mode process   flood Process messages, then ignore Shutdown
//	--mode denied    open egress streams to refused targets from 64 loops, ignore Shutdown
//	--mode halfopen  hold 32 egress connections to "up:80" (half of them half-closed), ignore Shutdown
//	--mode escapes   put terminal escapes in a State, a log line and its stderr, then stop in order
//	--mode slowread  open 256 egress connections to "up:80" and read nothing of what it sends, ignore Shutdown
//	--mode upload    open 256 egress connections to "up:80" and send 4 MiB on each, ignore Shutdown
//	--mode warmtalk  (a warm sandbox's guest) try egress before any bootstrap, then say "ready" unasked
//	--mode warmpings (a warm sandbox's guest) flood yamux pings before any bootstrap
//	--mode rootdirect ask for the host's own socket on the fd channel (a direct Connect), offered or not, and attack it (rootdirect_linux.go)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/internal/muxinject"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// defaultMode is set with -ldflags -X: the sandbox runs the agent with a
// fixed command line and an empty environment.
var defaultMode = "version"

// escapes is what the escapes mode hides in its text: OSC (set title),
// CSI (clear screen), C1 CSI and OSC, a carriage return.
const escapes = "\x1b]0;owned\x07\x1b[2J\u009b31m\u009dtitle\u009c\r"

func main() {
	mode := flag.String("mode", defaultMode, "see the package doc")
	tr := flag.String("transport", "unix:///run/oac/agent.sock", "endpoint")
	flag.Parse()
	ep, err := transport.Parse(*tr)
	if err != nil {
		fail(err)
	}
	endpoint = ep
	conn, err := ep.Dial(context.Background())
	if err != nil {
		fail(err)
	}
	switch *mode {
	case "garbage":
		junk := make([]byte, 4096)
		for i := range junk {
			junk[i] = byte(i*7 + 3)
		}
		_, _ = conn.Write(junk)
		buf := make([]byte, 1)
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := conn.Read(buf)
		fmt.Fprintln(os.Stderr, "badguest: host closed the connection after garbage:", err)
	case "version":
		sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
		if err != nil {
			fail(err)
		}
		_, _, err = protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 2, MaxVersion: 3, AgentVersion: "badguest", PID: os.Getpid()}, 10*time.Second)
		fmt.Fprintln(os.Stderr, "badguest: handshake:", err)
	default:
		hostile(*mode, muxinject.Wrap(conn))
	}
	os.Exit(1)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "badguest:", err)
	os.Exit(2)
}

// hostile runs one of the hostile modes after a correct handshake.
func hostile(mode string, conn *muxinject.Conn) {
	mc := protocol.MuxConfig(nil)
	mc.StreamOpenTimeout = 0
	sess, err := yamux.Client(conn, mc)
	if err != nil {
		fail(err)
	}
	caps := []string{protocol.CapProcess}
	if mode == "rootdirect" {
		caps = append(caps, protocol.CapDataFD, protocol.CapDataDirect)
	}
	ctl, welcome, err := protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "badguest-" + mode, PID: os.Getpid(), Capabilities: caps}, 10*time.Second)
	if err != nil {
		fail(err)
	}
	switch mode {
	case "warmtalk":
		warmTalk(sess, ctl)
		return
	case "warmpings":
		// Booted for nobody, it floods the session before any bootstrap:
		// the session's bounds hold while warm.
		fmt.Fprintln(os.Stderr, "badguest: attacking: warmpings")
		flood := strings.Repeat(string(muxinject.Frame(muxinject.TypePing, muxinject.FlagSYN, 0, 7, nil)), 1000)
		for i := 0; i < 2600; i++ {
			if conn.Inject([]byte(flood)) != nil {
				break
			}
		}
		for {
			if _, err := ctl.Recv(); err != nil {
				os.Exit(1)
			}
		}
	}
	boot, err := ctl.Recv() // the bootstrap
	if err != nil {
		fail(err)
	}
	ready := func(msg string) {
		if err := ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateReady, Message: msg}); err != nil {
			fail(err)
		}
	}
	// ignoreShutdown reads the control stream (so nothing blocks) and
	// never answers.
	ignoreShutdown := func() {
		for {
			if _, err := ctl.Recv(); err != nil {
				fmt.Fprintln(os.Stderr, "badguest: control stream ended:", err)
				os.Exit(1)
			}
		}
	}
	// Each attack starts half a second after ready, so the test sees the
	// control API answer before, during and after it.
	ready = func(ready func(string)) func(string) {
		return func(msg string) {
			ready(msg)
			time.Sleep(500 * time.Millisecond)
			fmt.Fprintln(os.Stderr, "badguest: attacking:", mode)
		}
	}(ready)
	switch mode {
	case "rootdirect":
		rootDirect(sess, ctl, welcome, boot, ready)
	case "window":
		ready("")
		_ = conn.Inject(muxinject.Frame(muxinject.TypeWindowUpdate, 0, 1, 0xffffffff, nil))
		ignoreShutdown()
	case "pings":
		ready("")
		flood := strings.Repeat(string(muxinject.Frame(muxinject.TypePing, muxinject.FlagSYN, 0, 7, nil)), 1000)
		for i := 0; i < 2600; i++ { // 31 MB
			if conn.Inject([]byte(flood)) != nil {
				break
			}
		}
		ignoreShutdown()
	case "streams":
		ready("")
		for {
			st, err := sess.OpenStream()
			if err != nil {
				break
			}
			st.Close()
		}
		ignoreShutdown()
	case "process":
		ready("")
		for i := range 200000 {
			if ctl.Send(protocol.TypeProcess, protocol.ProcessStatus{Name: "daemon", PID: 2 + i%30000, Running: i%2 == 0}) != nil {
				break
			}
		}
		ignoreShutdown()
	case "denied":
		ready("")
		gate := protocol.NewStreamGate(sess)
		for range 64 {
			go func() {
				for i := 0; ; i++ {
					st, err := gate.Open(context.Background(), protocol.StreamHeader{Kind: protocol.KindEgress, Host: "192.0.2.1", Port: 80 + i%100, Via: protocol.ViaConnect})
					if err != nil {
						return
					}
					_, _ = protocol.ReadEgressReply(st, 10*time.Second)
					st.Close()
				}
			}()
		}
		ignoreShutdown()
	case "halfopen":
		for i := range 32 {
			st, err := protocol.OpenStream(sess, protocol.StreamHeader{Kind: protocol.KindEgress, Host: "up", Port: 80, Via: protocol.ViaConnect})
			if err != nil {
				fail(err)
			}
			r, err := protocol.ReadEgressReply(st, 10*time.Second)
			if err != nil || !r.OK() {
				fail(fmt.Errorf("egress to up:80: %v %+v", err, r))
			}
			if i%2 == 0 {
				st.Close() // half-closed; the upstream keeps its half open
			}
		}
		ready("32 upstream connections held")
		ignoreShutdown()
	case "slowread", "upload":
		ready("")
		gate := protocol.NewStreamGate(sess)
		chunk := make([]byte, 64<<10)
		refused := 0
		for range 256 {
			st, err := gate.Open(context.Background(), protocol.StreamHeader{Kind: protocol.KindEgress, Host: "up", Port: 80, Via: protocol.ViaConnect})
			if err != nil {
				fail(err)
			}
			if r, err := protocol.ReadEgressReply(st, 10*time.Second); err != nil || !r.OK() {
				if mode == "slowread" {
					fail(fmt.Errorf("egress to up:80: %v %+v", err, r))
				}
				// Held at the host's receive budget, a new stream's
				// header waits past the host's header timeout: the
				// attacker just tries the next.
				refused++
				st.Close()
				continue
			}
			if mode == "upload" {
				go func() {
					for range 64 { // 4 MiB
						if _, err := st.Write(chunk); err != nil {
							return
						}
					}
				}()
			}
		}
		fmt.Fprintf(os.Stderr, "badguest: 256 connections tried, %d refused or timed out\n", refused)
		ignoreShutdown()
	case "escapes":
		fmt.Fprintln(os.Stderr, "badguest: stderr "+escapes+" end")
		_ = ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStarting, Message: "starting " + escapes})
		st, err := protocol.OpenStream(sess, protocol.StreamHeader{Kind: protocol.KindLog, Name: "daemon/stdout"})
		if err != nil {
			fail(err)
		}
		fmt.Fprintln(st, "log "+escapes+"\tend")
		st.Close()
		ready("ready " + escapes)
		for {
			f, err := ctl.Recv()
			if err != nil {
				os.Exit(1)
			}
			if f.Type == protocol.TypeShutdown {
				_ = ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped})
				time.Sleep(time.Second)
				os.Exit(0)
			}
		}
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
}

// warmTalk is a guest booted for nobody that will not wait: it tries the
// way out (the policy of a warm sandbox is empty), then reports ready
// though no bootstrap came, and reads on.
func warmTalk(sess *yamux.Session, ctl *protocol.Control) {
	st, err := protocol.OpenStream(sess, protocol.StreamHeader{Kind: protocol.KindEgress, Host: "up", Port: 80, Via: protocol.ViaConnect})
	if err != nil {
		fail(err)
	}
	r, err := protocol.ReadEgressReply(st, 10*time.Second)
	fmt.Fprintf(os.Stderr, "badguest: egress while warm: ok=%v code=%s err=%v\n", r.OK(), r.Code, err)
	st.Close()
	if err := ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateReady, Message: "ready, unasked"}); err != nil {
		fail(err)
	}
	fmt.Fprintln(os.Stderr, "badguest: attacking: warmtalk")
	for {
		if _, err := ctl.Recv(); err != nil {
			os.Exit(1)
		}
	}
}
