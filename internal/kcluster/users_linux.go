package kcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// User is an unprivileged user of the cluster: a client certificate,
// signed by the cluster's CA, with the user's name as its common name and
// its groups as organizations. The apiserver authenticates it as that
// user (and system:authenticated); RBAC grants it nothing until a test
// binds a Role or ClusterRole to it.
type User struct {
	// Name and Groups are what the apiserver authenticates.
	Name   string
	Groups []string
	// Kubeconfig is a kubeconfig file of this user (certificate and key
	// inline) for kubectl and client libraries.
	Kubeconfig string

	url    string
	client *http.Client
}

// User issues a client certificate for an unprivileged user name in
// groups and writes its kubeconfig into the cluster's directory. Each
// call issues a new certificate; the user exists only in the bindings a
// test makes. Names and groups starting with "system:" are refused: they
// are the cluster's own identities (system:masters, system:nodes, ...).
func (c *Cluster) User(name string, groups ...string) (*User, error) {
	if name == "" || strings.HasPrefix(name, "system:") {
		return nil, fmt.Errorf("kcluster: user %q: a test user needs a name outside system:", name)
	}
	for _, g := range groups {
		if g == "" || strings.HasPrefix(g, "system:") {
			return nil, fmt.Errorf("kcluster: user %q: group %q is the cluster's own", name, g)
		}
	}
	if c.pki == nil {
		return nil, errors.New("kcluster: the cluster is not started")
	}
	cert, key, err := c.pki.clientCert(name, groups...)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.users++
	n := c.users
	c.mu.Unlock()
	path := filepath.Join(c.Dir, "users", "user-"+strconv.Itoa(n)+".kubeconfig")
	if err := c.writeKubeconfig(path, name, map[string]any{"client-certificate-data": cert, "client-key-data": key}); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.ca)
	return &User{
		Name: name, Groups: groups, Kubeconfig: path, url: c.URL,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{pair},
		}}},
	}, nil
}

// UserKubeconfig is User's kubeconfig file: the path of a kubeconfig of
// a new unprivileged user name in groups.
func (c *Cluster) UserKubeconfig(name string, groups ...string) (string, error) {
	u, err := c.User(name, groups...)
	if err != nil {
		return "", err
	}
	return u.Kubeconfig, nil
}

// Do is Cluster.Do as this user: a refusal is an *APIError with Status
// 403 (IsForbidden).
func (u *User) Do(ctx context.Context, method, path string, body, out any) error {
	return do(ctx, u.client, u.url, "", method, path, body, out)
}

// Get is Do with GET.
func (u *User) Get(ctx context.Context, path string, out any) error {
	return u.Do(ctx, http.MethodGet, path, nil, out)
}

// IsForbidden reports whether err is the API's 403 (authorization
// refused the request).
func IsForbidden(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusForbidden
}
