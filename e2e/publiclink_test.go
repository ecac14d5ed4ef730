//go:build linux

package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/e2e/internal/standin/linkrelay"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// publicAddr is a globally reachable address (no refused class) the run
// routes from the host into a network namespace of its own, where the
// public Link and a web server listen: a Link a name rule could allow,
// reached with no rule at all. Nothing leaves the machine: while the run
// lasts the host's route for this one address points into the namespace.
const publicAddr = "1.2.3.4"

// publicAddr6 is publicAddr's IPv6 twin (global unicast, no refused
// class), on the same namespace's lo: routed from the host like
// publicAddr while the run lasts (publicLink6).
const publicAddr6 = "2000::1:2:3:4"

// publicHosts is a shim's /etc/hosts (sandboxSpec.hosts) in which the
// broker finds relay.test on the public address; guests have their own.
const publicHosts = "127.0.0.1 localhost\n::1 localhost\n" + publicAddr + " relay.test\n"

// The veth pair between the host and the namespace (and its IPv6
// addresses, publicLink6's).
const (
	pubHostAddr6 = "fd7e:2e2e:77::1"
	pubNSAddr6   = "fd7e:2e2e:77::2"
	pubHostAddr  = "10.254.77.1"
	pubNSAddr    = "10.254.77.2"
	pubNS        = "oac-e2e-public"
	pubVeth      = "oacpub0"
)

var public struct {
	once    sync.Once
	once6   sync.Once
	err6    error
	started bool
	err     error
	relay   *linkrelay.Relay
	servers []*http.Server
}

// publicLink returns the run's public Link: its relay and its URL,
// wss://1.2.3.4/api/v1/sandbox-link, served by a certificate for the
// address and for relay.test (publicHosts names it so for a shim's
// broker) that the run's CA signed. A web server answers on port 80 of
// the same address.
func publicLink(t *testing.T) (*linkrelay.Relay, string) {
	t.Helper()
	need(t, os.Geteuid() == 0, "the public Link is a network namespace with a host route: run the e2e tests as root")
	_, err := exec.LookPath("ip")
	need(t, err == nil, "iproute2 is not installed: apt-get install iproute2")
	testCA(t)
	cert := runCert(t, "relay.test", netip.MustParseAddr(publicAddr).AsSlice())
	public.once.Do(func() { public.started = true; public.err = startPublic(cert) })
	require.NoError(t, public.err, "the public Link's namespace")
	return public.relay, "wss://" + publicAddr + linkrelay.Path
}

func startPublic(cert tls.Certificate) error {
	// The address must be one a name rule could allow.
	if _, err := egress.LinkRule("wss://" + publicAddr + "/"); err != nil {
		return err
	}
	// What a killed run left goes first: its namespace, and its host end
	// of the pair, which outlives the namespace while anything still
	// holds that.
	_ = exec.Command("ip", "link", "del", pubVeth).Run()
	_ = exec.Command("ip", "netns", "del", pubNS).Run()
	for _, args := range [][]string{
		{"netns", "add", pubNS},
		{"link", "add", pubVeth, "type", "veth", "peer", "name", "eth0", "netns", pubNS},
		{"addr", "add", pubHostAddr + "/30", "dev", pubVeth},
		{"link", "set", pubVeth, "up"},
		{"-n", pubNS, "addr", "add", pubNSAddr + "/30", "dev", "eth0"},
		{"-n", pubNS, "addr", "add", publicAddr + "/32", "dev", "lo"},
		{"-n", pubNS, "link", "set", "lo", "up"},
		{"-n", pubNS, "link", "set", "eth0", "up"},
		{"-n", pubNS, "route", "add", "default", "via", pubHostAddr},
		{"route", "replace", publicAddr + "/32", "via", pubNSAddr},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			stopPublic()
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	public.relay = &linkrelay.Relay{Digest: bootstrap.CredentialDigest(linkCredential)}
	web := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "public web: %s", r.URL.Path)
	})
	for _, l := range []struct {
		port int
		h    http.Handler
		tls  bool
	}{{443, public.relay, true}, {80, web, false}} {
		ln, err := listenInNetns("/run/netns/"+pubNS, net.JoinHostPort(publicAddr, fmt.Sprint(l.port)))
		if err != nil {
			stopPublic()
			return err
		}
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 10 * time.Second}
		if l.tls {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		public.servers = append(public.servers, srv)
		go func() { _ = srv.Serve(ln) }()
	}
	return nil
}

// publicLink6 adds publicAddr6 to the public Link's namespace, routed from
// the host over the veth pair, with a web server on its port 80 ("public
// web6: PATH"): a globally reachable IPv6 destination that never leaves
// the machine.
func publicLink6(t *testing.T) {
	t.Helper()
	publicLink(t)
	public.once6.Do(func() { public.err6 = startPublic6() })
	require.NoError(t, public.err6, "the public IPv6 address (does this host have IPv6? sysctl net.ipv6.conf.all.disable_ipv6 must be 0)")
}

func startPublic6() error {
	for _, args := range [][]string{
		// replace, not add: an address already there (the kernel kept
		// it on the host end, or a run before this one left it) is fine.
		{"-6", "addr", "replace", pubHostAddr6 + "/64", "dev", pubVeth, "nodad"},
		{"-n", pubNS, "-6", "addr", "replace", pubNSAddr6 + "/64", "dev", "eth0", "nodad"},
		{"-n", pubNS, "-6", "addr", "replace", publicAddr6 + "/128", "dev", "lo"},
		{"-n", pubNS, "-6", "route", "replace", "default", "via", pubHostAddr6},
		{"-6", "route", "replace", publicAddr6 + "/128", "via", pubNSAddr6},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ln, err := listenInNetns("/run/netns/"+pubNS, net.JoinHostPort(publicAddr6, "80"))
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "public web6: %s", r.URL.Path)
	})}
	public.servers = append(public.servers, srv)
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// stopPublic removes the namespace (its veth and the host's route go with
// it); TestMain calls it.
func stopPublic() {
	if !public.started {
		return
	}
	for _, s := range public.servers {
		s.Close()
	}
	if public.relay != nil {
		public.relay.Close()
	}
	_ = exec.Command("ip", "route", "del", publicAddr+"/32").Run()
	_ = exec.Command("ip", "-6", "route", "del", publicAddr6+"/128").Run()
	_ = exec.Command("ip", "link", "del", pubVeth).Run()
	_ = exec.Command("ip", "netns", "del", pubNS).Run()
}

// listenInNetns listens on addr in the network namespace at path: the
// socket stays in it, served from any goroutine.
func listenInNetns(path, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer own.Close()
	ns, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", path, err)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the other namespace: it must die with its
		// goroutine, never be reused (it is never unlocked).
		return nil, fmt.Errorf("return from %s: %w", path, err)
	}
	runtime.UnlockOSThread()
	return l, lerr
}
