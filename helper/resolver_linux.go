package helper

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"

	"github.com/oac/sandbox-agent/protocol"
)

// ErrOwnResolvConf says the guest's resolver configuration is the agent's
// own: it names the workload's resolver, which is the broker's client, not
// a nameserver the broker can ask.
var ErrOwnResolvConf = errors.New("/etc/resolv.conf is the agent's own (an oac image's, naming the workload's resolver), not the platform's: " +
	"egress to names cannot be resolved until the platform writes its nameservers there (rules by address still work)")

// pinnedResolver resolves with the nameservers resolvConf lists now. The
// agent then points /etc/resolv.conf at its own resolver, which serves in
// the workload's network namespace, not the broker's: the broker keeps
// the guest's own. nil (the default resolver) when there are none, and
// ErrOwnResolvConf when the file is already the agent's.
func pinnedResolver(resolvConf string) (*net.Resolver, []string, error) {
	data, err := os.ReadFile(resolvConf)
	if err != nil {
		return nil, nil, nil
	}
	if string(data) == protocol.ResolvConf {
		return nil, nil, ErrOwnResolvConf
	}
	var servers []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				servers = append(servers, netip.AddrPortFrom(a.WithZone(""), 53).String())
			}
		}
	}
	if len(servers) == 0 {
		return nil, nil, nil
	}
	var next atomic.Uint32
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, servers[int(next.Add(1)-1)%len(servers)])
		},
	}, servers, nil
}
