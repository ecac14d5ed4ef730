package kcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is what Start writes for the cluster: a CA, the apiserver's serving
// certificate, the apiserver's client certificate for the kubelet, the
// kubelet's serving certificate, the serving certificate of the scheduler
// and the controller manager (loopback), the front proxy's CA and client
// certificate, and the service-account key pair.
// Client certificates of the components and of test users are issued from
// the CA's key in memory (clientCert); the controller manager's CSR signer
// reads it from its file.
type pki struct {
	caPEM                        []byte
	ca                           *x509.Certificate
	caKey                        *ecdsa.PrivateKey
	caFile, caKeyFile            string
	serverCert, serverKey        string
	kubeletClient, kubeletClKey  string
	saKey, saPub                 string
	kubeletServing, kubeletSvKey string
	loopServing, loopSvKey       string
	frontCAFile                  string
	proxyClient, proxyClKey      string
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// issue returns a certificate signed by the CA and its key, as PEM.
func (p *pki) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(7 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// clientCert issues a client certificate of the user cn in the groups
// orgs (what the apiserver authenticates it as).
func (p *pki) clientCert(cn string, orgs ...string) (certPEM, keyPEM []byte, err error) {
	return p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// leaf writes a certificate signed by the CA and its key.
func (p *pki) leaf(certFile, keyFile string, tmpl *x509.Certificate) error {
	cert, key, err := p.issue(tmpl)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyFile, key, 0o600)
}

// makeCA makes p a new self-signed CA named cn, its certificate written
// to file.
func (p *pki) makeCA(cn, file string) error {
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p.caFile = file
	return os.WriteFile(file, p.caPEM, 0o644)
}

// newPKI writes the cluster's certificates and keys into dir.
func newPKI(dir string, serverIPs []net.IP, nodeIP net.IP, nodeName string) (*pki, error) {
	p := &pki{
		caFile:         filepath.Join(dir, "ca.crt"),
		caKeyFile:      filepath.Join(dir, "ca.key"),
		serverCert:     filepath.Join(dir, "apiserver.crt"),
		serverKey:      filepath.Join(dir, "apiserver.key"),
		kubeletClient:  filepath.Join(dir, "apiserver-kubelet-client.crt"),
		kubeletClKey:   filepath.Join(dir, "apiserver-kubelet-client.key"),
		kubeletServing: filepath.Join(dir, "kubelet.crt"),
		kubeletSvKey:   filepath.Join(dir, "kubelet.key"),
		loopServing:    filepath.Join(dir, "loopback-serving.crt"),
		loopSvKey:      filepath.Join(dir, "loopback-serving.key"),
		saKey:          filepath.Join(dir, "sa.key"),
		saPub:          filepath.Join(dir, "sa.pub"),
		frontCAFile:    filepath.Join(dir, "front-proxy-ca.crt"),
		proxyClient:    filepath.Join(dir, "front-proxy-client.crt"),
		proxyClKey:     filepath.Join(dir, "front-proxy-client.key"),
	}
	if err := p.makeCA("oac-kcluster-ca", p.caFile); err != nil {
		return nil, err
	}
	// The CA's key, for the controller manager's CSR signer.
	kder, err := x509.MarshalECPrivateKey(p.caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.caKeyFile, "EC PRIVATE KEY", kder); err != nil {
		return nil, err
	}
	// The front proxy's CA and client (the apiserver's requestheader
	// authentication, which the scheduler's and the controller manager's
	// delegated authentication read), a CA of its own as kubeadm's: no
	// user of the cluster's CA may set X-Remote-User.
	front := &pki{}
	if err := front.makeCA("oac-kcluster-front-proxy-ca", p.frontCAFile); err != nil {
		return nil, err
	}
	if err := front.leaf(p.proxyClient, p.proxyClKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "front-proxy-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}
	if err := p.leaf(p.serverCert, p.serverKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: serverIPs,
	}); err != nil {
		return nil, err
	}
	if err := p.leaf(p.kubeletClient, p.kubeletClKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}
	if err := p.leaf(p.kubeletServing, p.kubeletSvKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{nodeName},
		IPAddresses: []net.IP{nodeIP},
	}); err != nil {
		return nil, err
	}
	// What the scheduler and the controller manager serve their health
	// on (loopback only).
	if err := p.leaf(p.loopServing, p.loopSvKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "oac-kcluster-loopback"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}); err != nil {
		return nil, err
	}
	// The service-account key pair (RSA: every issuer and verifier
	// accepts it).
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}
