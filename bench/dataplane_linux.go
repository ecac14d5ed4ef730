package bench

// The egress tunnel on the data plane's fd channel, in one process like
// the yamux tunnel of egress.go: client -> guest proxy -> its end of a
// socketpair (passed over the channel) -> broker -> loopback upstream.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/oac/sandbox-agent/egress"
	guestdp "github.com/oac/sandbox-agent/guest/dataplane"
	guestegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/host/dataplane"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// dataStack starts the broker behind a data plane listener and the guest
// proxy on its fd channel; it returns the proxy's address.
func dataStack(upAddr string) (string, func(), error) {
	if !dataplane.CanMakePairs() {
		return "", nil, fmt.Errorf("the fd channel needs CAP_SYS_ADMIN (root)")
	}
	dir, err := os.MkdirTemp("", "oac-bench-dp-")
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	pol, err := egress.ParsePolicy(nil, []string{"bench.test:9=" + upAddr})
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	const token = "00000000000000000000000000000000"
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		dataplane.Serve(func(ctx context.Context) (net.Conn, error) {
			stop := context.AfterFunc(ctx, func() { _ = ln.SetDeadline(time.Now()) })
			defer stop()
			return ln.Accept()
		}, dataplane.Config{Ctx: ctx, Broker: egress.New(egress.Config{Policy: pol, MaxStreams: 4096}),
			Token: token, Offer: []string{protocol.CapDataFD}})
	}()
	ep, _ := transport.Parse("unix://" + path)
	ch, err := guestdp.DialChannel(ctx, ep, token, nil, nil)
	if err != nil {
		cancel()
		ln.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	// No session in this benchmark: the pairs are the only way out.
	px, err := guestegress.StartWith(net.Listen, guestegress.NewExit(nil, guestdp.Carrier(ch.Open).Way("pair")), "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		ch.Close()
		cancel()
		ln.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	return px.HTTPAddr, func() {
		px.Close()
		ch.Close()
		cancel()
		ln.Close()
		<-served
		os.RemoveAll(dir)
	}, nil
}
