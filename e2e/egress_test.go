//go:build linux

package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// tlsFor returns a server certificate for name signed by a fresh CA, and
// the CA in PEM.
func tlsFor(t *testing.T, name string) (tls.Certificate, string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "oac e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
}

// listen listens on the host's loopback only.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

func portOf(ln net.Listener) int { return ln.Addr().(*net.TCPAddr).Port }

// wsEchoServer speaks just enough RFC 6455 to echo text frames.
func wsEchoServer(t *testing.T) net.Listener {
	ln := listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
					return
				}
				sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
				fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
					base64.StdEncoding.EncodeToString(sum[:]))
				for {
					var h [2]byte
					if _, err := io.ReadFull(br, h[:]); err != nil {
						return
					}
					n := int(h[1] & 0x7f)
					if n == 126 {
						var l [2]byte
						if _, err := io.ReadFull(br, l[:]); err != nil {
							return
						}
						n = int(binary.BigEndian.Uint16(l[:]))
					}
					var mask [4]byte
					if h[1]&0x80 != 0 {
						if _, err := io.ReadFull(br, mask[:]); err != nil {
							return
						}
					}
					p := make([]byte, n)
					if _, err := io.ReadFull(br, p); err != nil {
						return
					}
					for i := range p {
						p[i] ^= mask[i%4]
					}
					if n > 125 {
						return
					}
					_, _ = c.Write(append([]byte{h[0], byte(n)}, p...))
				}
			}()
		}
	}()
	return ln
}

// egressBootstrap runs a bash script as the daemon with extra env.
func egressBootstrap(script string, env ...string) string {
	argv, _ := json.Marshal([]string{"/bin/bash", "-c", script})
	e, _ := json.Marshal(env)
	return `{"version":1,"stop_grace":"1s","daemon":{"argv":` + string(argv) + `,"env":` + string(e) + `}}`
}

// wsScript opens a CONNECT tunnel through the guest's HTTP proxy with
// bash's /dev/tcp, upgrades to a websocket and echoes one masked frame.
const wsScript = `
ws() {
  exec 3<>/dev/tcp/127.0.0.1/3128 || { echo "ws: no proxy"; return; }
  printf 'CONNECT ws.test:80 HTTP/1.1\r\nHost: ws.test:80\r\n\r\n' >&3
  IFS= read -r status <&3
  while IFS= read -r l <&3 && [ "${l%$'\r'}" != "" ]; do :; done
  printf 'GET /echo HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n' >&3
  IFS= read -r up <&3
  while IFS= read -r l <&3 && [ "${l%$'\r'}" != "" ]; do :; done
  printf '\x81\x85\x00\x00\x00\x00hello' >&3
  reply=$(head -c 7 <&3 | tail -c 5)
  echo "ws: ${status%$'\r'}|${up%$'\r'}|$reply"
  exec 3<&-
}
`

func TestEgressWithRealCurlThroughTheBroker(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	needUnshare(t)
	cert, caPEM := tlsFor(t, "api.test")
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "secure hello from %s%s", r.Host, r.URL.Path)
	}))
	upstream.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	upstream.StartTLS()
	defer upstream.Close()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain hello from %s%s", r.Host, r.URL.Path)
	}))
	defer web.Close()
	ws := wsEchoServer(t)
	webPort := web.Listener.Addr().(*net.TCPAddr).Port

	script := wsScript + fmt.Sprintf(`
printf '%%s\n' "$CA_PEM" > /tmp/ca.pem
echo "https: $(curl -sS -m 10 --cacert /tmp/ca.pem https://api.test/hello 2>&1)"
echo "http: $(curl -sS -m 10 http://web.test/page 2>&1)"
echo "socks: $(curl -sS -m 10 --proxy socks5h://127.0.0.1:1080 http://web.test/socks 2>&1)"
echo "denied: $(curl -sS -m 10 -i http://blocked.test/ 2>&1 | tr -d '\r' | tr '\n' '|')"
echo "port: $(curl -sS -m 10 -o /dev/null -w '%%{http_connect}' https://x.example.invalid:25/ 2>&1 | tr '\n' '|')"
echo "localhost: $(curl -sS -m 10 --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%%{http_code}' http://localhost:%d/ 2>&1)"
echo "metadata: $(curl -sS -m 10 -o /dev/null -w '%%{http_code}' http://metadata.test/latest/meta-data/ 2>&1)"
ws
echo "done"
exec sleep 1000
`, webPort)
	s := startShim(t, sandboxSpec{
		bootstrap: egressBootstrap(script, "CA_PEM="+caPEM),
		hosts:     "127.0.0.1 localhost\n::1 localhost\n169.254.169.254 metadata.test\n",
		args: []string{
			"--upstream", "api.test:443=" + upstream.Listener.Addr().String(),
			"--upstream", "web.test:80=" + web.Listener.Addr().String(),
			"--upstream", fmt.Sprintf("ws.test:80=127.0.0.1:%d", portOf(ws)),
			"--allow", "*.example.invalid:443",
			"--allow", fmt.Sprintf("localhost:%d", webPort),
			"--allow", "metadata.test:80",
		},
	})
	s.waitState(api.StateReady, bootTimeout)
	s.waitLog("done", 60*time.Second)

	// An allowed HTTPS name mapped to a loopback TLS upstream, through
	// CONNECT: the certificate for api.test verifies end to end.
	assert.Equal(t, "secure hello from api.test/hello", s.logLine("https: "))
	assert.Equal(t, "plain hello from web.test/page", s.logLine("http: "))
	assert.Equal(t, "plain hello from web.test/socks", s.logLine("socks: "))

	denied := s.logLine("denied: ")
	assert.Contains(t, denied, "HTTP/1.1 403 Forbidden|")
	assert.Contains(t, denied, "|X-Sandbox-Egress: denied|")
	assert.Contains(t, denied, "|X-Sandbox-Egress-Code: 3 Denied|")
	assert.Contains(t, denied, "|X-Sandbox-Egress-Reason: no rule allows blocked.test:80; nothing was resolved|")
	assert.Contains(t, denied, "not a network fault")
	assert.Contains(t, denied, "Retrying will not help")

	assert.Contains(t, s.logLine("port: "), "403", "a denied port is refused at CONNECT")
	assert.Equal(t, "403", s.logLine("localhost: "), "an allowed name resolving to 127.0.0.1 needs a CIDR rule")
	assert.Equal(t, "403", s.logLine("metadata: "), "an allowed name resolving to 169.254.169.254 needs a CIDR rule")
	assert.Equal(t, "HTTP/1.1 200 Connection established|HTTP/1.1 101 Switching Protocols|hello", s.logLine("ws: "),
		"a websocket echoes through CONNECT")

	egress := func(target string) api.Event {
		evs := s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Target == target })
		require.NotEmpty(t, evs, "an egress event for %s", target)
		return evs[0]
	}
	e := egress("api.test:443")
	assert.Equal(t, "allowed", e.Decision)
	assert.Equal(t, "connect", e.Via)
	assert.Equal(t, "upstream api.test:443="+upstream.Listener.Addr().String(), e.Rule)
	closed := s.find(func(c api.Event) bool { return c.Event == api.KindEgressClosed && c.Conn == e.Conn })
	require.Len(t, closed, 1)
	assert.Positive(t, *closed[0].BytesIn)
	assert.Positive(t, *closed[0].BytesOut)
	assert.NotNil(t, closed[0].DurationMS)
	assert.Equal(t, "socks5", s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Via == "socks5" })[0].Via)

	e = egress("x.example.invalid:25")
	assert.Equal(t, "denied", e.Decision)
	assert.Equal(t, "Denied", e.Code, "a lookup of a .invalid name would have failed as NameNotResolved: the port was checked first")
	assert.Equal(t, "*.example.invalid:443", e.Rule)
	assert.Contains(t, e.Reason, "nothing was resolved")

	e = egress(fmt.Sprintf("localhost:%d", webPort))
	assert.Equal(t, "denied", e.Decision)
	assert.Contains(t, e.Reason, "localhost resolves to 127.0.0.1, which is loopback")

	e = egress("metadata.test:80")
	assert.Equal(t, "denied", e.Decision)
	assert.Contains(t, e.Reason, "metadata.test resolves to 169.254.169.254, which is cloud metadata")
	assert.Equal(t, "metadata.test:80", e.Rule)
	assert.Equal(t, "none", e.Effect)

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestEgressStreamLimitGivesResourceExhausted(t *testing.T) {
	needBwrap(t)
	hold := listen(t)
	go func() {
		for {
			c, err := hold.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	// Two tunnels stay open; the third CONNECT is over the limit of 2.
	script := `
exec 5<>/dev/tcp/127.0.0.1/3128
exec 6<>/dev/tcp/127.0.0.1/3128
printf 'CONNECT hold.test:80 HTTP/1.1\r\nHost: hold.test:80\r\n\r\n' >&5
IFS= read -r l5 <&5
printf 'CONNECT hold.test:80 HTTP/1.1\r\nHost: hold.test:80\r\n\r\n' >&6
IFS= read -r l6 <&6
echo "held: ${l5%$'\r'}|${l6%$'\r'}"
exec 7<>/dev/tcp/127.0.0.1/3128
printf 'CONNECT hold.test:80 HTTP/1.1\r\nHost: hold.test:80\r\n\r\n' >&7
echo "third: $(timeout 10 cat <&7 | tr -d '\r' | tr '\n' '|')"
echo "done"
exec sleep 1000
`
	s := startShim(t, sandboxSpec{
		bootstrap: egressBootstrap(script),
		args:      []string{"--egress-max-streams", "2", "--upstream", fmt.Sprintf("hold.test:80=127.0.0.1:%d", portOf(hold))},
	})
	s.waitState(api.StateReady, bootTimeout)
	s.waitLog("done", 30*time.Second)
	assert.Equal(t, "HTTP/1.1 200 Connection established|HTTP/1.1 200 Connection established", s.logLine("held: "))
	third := s.logLine("third: ")
	assert.Contains(t, third, "HTTP/1.1 503 Service Unavailable|")
	assert.Contains(t, third, "|X-Sandbox-Egress: failed|")
	assert.Contains(t, third, "|X-Sandbox-Egress-Code: 9 ResourceExhausted|")
	assert.Contains(t, third, "limit of 2 concurrent egress connections")
	failed := s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Code == "ResourceExhausted" })
	require.NotEmpty(t, failed)
	assert.Equal(t, "failed", failed[0].Decision)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
