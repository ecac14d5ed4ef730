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
// certificate, the apiserver's client certificate for the kubelet, and the
// service-account key pair.
type pki struct {
	caPEM                        []byte
	ca                           *x509.Certificate
	caKey                        *ecdsa.PrivateKey
	caFile                       string
	serverCert, serverKey        string
	kubeletClient, kubeletClKey  string
	saKey, saPub                 string
	kubeletServing, kubeletSvKey string
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// leaf writes a certificate signed by the CA and its key.
func (p *pki) leaf(certFile, keyFile string, tmpl *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(7 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kder)
}

// newPKI writes the cluster's certificates and keys into dir.
func newPKI(dir string, serverIPs []net.IP, nodeIP net.IP, nodeName string) (*pki, error) {
	p := &pki{
		caFile:         filepath.Join(dir, "ca.crt"),
		serverCert:     filepath.Join(dir, "apiserver.crt"),
		serverKey:      filepath.Join(dir, "apiserver.key"),
		kubeletClient:  filepath.Join(dir, "apiserver-kubelet-client.crt"),
		kubeletClKey:   filepath.Join(dir, "apiserver-kubelet-client.key"),
		kubeletServing: filepath.Join(dir, "kubelet.crt"),
		kubeletSvKey:   filepath.Join(dir, "kubelet.key"),
		saKey:          filepath.Join(dir, "sa.key"),
		saPub:          filepath.Join(dir, "sa.pub"),
	}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "oac-kcluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return nil, err
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(p.caFile, p.caPEM, 0o644); err != nil {
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
