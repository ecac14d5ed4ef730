//go:build linux

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/e2e/internal/standin/linkrelay"
	"github.com/oac/sandbox-agent/internal/dockerd"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Fixtures several tests share, made once per run: a test CA the guest
// images trust, the image oac-image builds from the stand-ins (its
// rootfs tarball is what WSL imports and what the Docker engine runs) and
// the Docker engine.

// runCA is this run's test CA: relay certificates are signed by it, and
// the guest images carry it in their CA bundle.
var runCA struct {
	once   sync.Once
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pem    string
	bundle string // the host's bundle plus the CA, as a file
	err    error
}

func testCA(t *testing.T) {
	t.Helper()
	runCA.once.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			runCA.err = err
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "oac e2e run CA"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			runCA.err = err
			return
		}
		runCA.cert, _ = x509.ParseCertificate(der)
		runCA.key = key
		runCA.pem = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		host, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
		runCA.bundle = filepath.Join(bins.dir, "ca-bundle.crt")
		runCA.err = os.WriteFile(runCA.bundle, append(host, []byte("\n"+runCA.pem)...), 0o644)
	})
	require.NoError(t, runCA.err)
}

// runCert is a certificate for name (and the addresses ips) signed by the
// run's CA.
func runCert(t *testing.T, name string, ips ...net.IP) tls.Certificate {
	t.Helper()
	testCA(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	leaf := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}, IPAddresses: ips,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, runCA.cert, &key.PublicKey, runCA.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// runRelay is a TLS Link stand-in for relay.test whose certificate the
// run's images trust.
func runRelay(t *testing.T) (*linkrelay.Relay, *httptest.Server) {
	t.Helper()
	relay := &linkrelay.Relay{Digest: bootstrap.CredentialDigest(linkCredential)}
	srv := httptest.NewUnstartedServer(relay)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{runCert(t, "relay.test")}}
	srv.StartTLS()
	t.Cleanup(func() { relay.Close(); srv.Close() })
	return relay, srv
}

// builtImage is a guest image oac-image builds once per run from an empty
// base: an agent, the oac-sandbox-io stand-in, the daemon stand-in at
// daemonBin and the run's CA bundle.
type builtImage struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

// build builds the image into bins.dir/name once, with agent and outputs
// (oac-image --output), and returns its directory.
func (img *builtImage) build(t *testing.T, name, agent, outputs string) string {
	t.Helper()
	needImageBuild(t)
	testCA(t)
	img.once.Do(func() {
		img.dir = filepath.Join(bins.dir, name)
		cmd := exec.Command(bins.image, "build", "--agent", agent, "--sandbox-io", bins.sandboxIO,
			"--ca-bundle", runCA.bundle, "--file", bins.daemon+":"+daemonBin+":0755",
			"--output", outputs, "--epoch", "1", "-o", img.dir)
		img.out, img.err = cmd.CombinedOutput()
	})
	require.NoError(t, img.err, "oac-image build: %s", img.out)
	return img.dir
}

// runImage is the run's image, as a rootfs tarball and directory;
// doorsOffImage has bins.guestDoorsOff as its agent (the guest that
// closes no platform door), as a tarball.
var runImage, doorsOffImage builtImage

// guestImage returns the rootfs tarball of the run's image.
func guestImage(t *testing.T) string {
	t.Helper()
	return filepath.Join(runImage.build(t, "image", bins.guest, "tar,dir"), "rootfs.tar.gz")
}

func guestImageDoorsOff(t *testing.T) string {
	t.Helper()
	return filepath.Join(doorsOffImage.build(t, "image-doors-off", bins.guestDoorsOff, "tar"), "rootfs.tar.gz")
}

// guestRootfs returns the run's image as a directory (oac-image's rootfs/
// output, what bwrap and the OCI runtimes take as --rootfs).
func guestRootfs(t *testing.T) string {
	t.Helper()
	guestImage(t)
	return filepath.Join(runImage.dir, "rootfs")
}

func needImageBuild(t *testing.T) {
	t.Helper()
	need(t, os.Geteuid() == 0, "guest images carry owners 0 and 1000: run the e2e tests as root (sudo make test)")
}

// The Docker engine: the one reachable at DOCKER_HOST or the default
// socket, else a private dockerd this run starts (vfs storage, no bridge,
// no iptables) and TestMain stops.
var engine struct {
	mu      sync.Mutex
	e       *dockerd.Engine
	err     error
	started bool
	images  map[string]string // tarball -> image reference
}

// needDocker returns the Docker engine, starting one when none answers.
func needDocker(t *testing.T) *dockerd.Engine {
	t.Helper()
	missing := dockerd.Missing()
	need(t, missing == "", missing)
	need(t, os.Geteuid() == 0, "the docker provider keeps sandbox state in /run/oac and the tests start dockerd: run the e2e tests as root (sudo make test)")
	engine.mu.Lock()
	defer engine.mu.Unlock()
	if !engine.started {
		engine.started = true
		engine.e, engine.err = dockerd.Start(context.Background())
	}
	require.NoError(t, engine.err, "Docker engine")
	return engine.e
}

// dockerImage imports the run's image into the engine once and returns
// its reference.
func dockerImage(t *testing.T) string {
	t.Helper()
	e := needDocker(t)
	tarball := guestImage(t)
	engine.mu.Lock()
	defer engine.mu.Unlock()
	if ref, ok := engine.images[tarball]; ok {
		return ref
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ref := "oac-e2e/guest:" + hex.EncodeToString(b)
	_, err := e.Import(context.Background(), tarball, ref)
	require.NoError(t, err, "docker import %s", tarball)
	if engine.images == nil {
		engine.images = map[string]string{}
	}
	engine.images[tarball] = ref
	return ref
}

// stopEngine removes the images the run imported and stops the engine if
// the run started it.
func stopEngine() error {
	engine.mu.Lock()
	defer engine.mu.Unlock()
	if engine.e == nil {
		return nil
	}
	var errs []error
	for _, ref := range engine.images {
		if _, err := engine.e.Docker(context.Background(), "image", "rm", "--force", ref); err != nil {
			errs = append(errs, err)
		}
	}
	if err := engine.e.Stop(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	return nil
}
