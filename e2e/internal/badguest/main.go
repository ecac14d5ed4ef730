//go:build linux

// Command badguest is a deliberately misbehaving guest agent for end-to-end
// tests: the shim boots it in a real sandbox instead of oac-guest and must
// fail cleanly.
//
//	--mode version   speak protocol versions 2..3 (the host speaks 1..1)
//	--mode garbage   write bytes that are not a yamux session
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// defaultMode is set with -ldflags -X: the sandbox runs the agent with a
// fixed command line and an empty environment.
var defaultMode = "version"

func main() {
	mode := flag.String("mode", defaultMode, "version or garbage")
	tr := flag.String("transport", "unix:///run/oac/agent.sock", "endpoint")
	flag.Parse()
	ep, err := transport.Parse(*tr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "badguest:", err)
		os.Exit(2)
	}
	conn, err := ep.Dial(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "badguest:", err)
		os.Exit(2)
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
	default:
		sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
		if err != nil {
			fmt.Fprintln(os.Stderr, "badguest:", err)
			os.Exit(2)
		}
		_, _, err = protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 2, MaxVersion: 3, AgentVersion: "badguest", PID: os.Getpid()}, 10*time.Second)
		fmt.Fprintln(os.Stderr, "badguest: handshake:", err)
	}
	os.Exit(1)
}
