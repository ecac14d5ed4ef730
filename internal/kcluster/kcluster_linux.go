package kcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/hostclean"
)

// Version is the Kubernetes version tools/k8s builds.
const Version = "v1.37.2"

// BridgePrefix begins the name of a cluster's CNI bridge; its Pods' host
// veths have it as their master.
const BridgePrefix = "oackc"

// PodSubnet is the CNI bridge's subnet (a benchmarking range nothing else
// here uses); ServiceSubnet is the apiserver's service range (never
// routed).
const (
	PodSubnet     = "198.18.0.0/24"
	ServiceSubnet = "198.18.1.0/24"
)

// PodGateway is the node's address on the CNI bridge: the one address of
// the node a Pod has a route to (the Pods have no default route).
const PodGateway = "198.18.0.1"

// Options says how to start a cluster. The zero value builds the binaries
// into the user cache directory (once) and starts a cluster in a new
// temporary directory.
type Options struct {
	// BinDir holds prebuilt kube-apiserver, kubelet, kube-scheduler and
	// kube-controller-manager; nothing is built.
	BinDir string
	// CacheDir is where the binaries are built once and then reused
	// (default: the user cache directory's sandbox-agent/kcluster/VERSION).
	CacheDir string
	// ToolsDir is tools/k8s (default: found from the working directory
	// upwards).
	ToolsDir string
	// Log, when set, receives progress lines.
	Log func(format string, a ...any)
	// ReadyTimeout bounds the wait for the node to be Ready and
	// schedulable (default 3m).
	ReadyTimeout time.Duration
}

// Cluster is a running single-node cluster.
type Cluster struct {
	// URL is the apiserver's https URL.
	URL string
	// CA is the PEM of the CA that signed the apiserver's certificate.
	CA []byte
	// Token is a bearer token of a user in system:masters (RBAC and the
	// Node authorizer let it do anything); User makes unprivileged users.
	Token string
	// Kubeconfig is a kubeconfig file of that user for kubectl and client
	// libraries.
	Kubeconfig string
	// NodeName is the one node's name; NodeIP its InternalIP.
	NodeName, NodeIP string
	// Dir is the temporary directory holding everything the cluster made.
	Dir string
	// Timings records how long Start's steps took.
	Timings map[string]time.Duration

	client         *http.Client
	pki            *pki
	ctrSock        string
	hostPathPre    []string // HostPathPVDir's entries at Start (non-nil once recorded)
	hostPathDirPre bool
	mu             sync.Mutex
	users          int
	bridge         string
	cgroupRoot     string
	procs          []*proc
	netnsPre       []string
	chainsPre      []string
	ipsetsPre      []string // the host's ipsets when the enforcer started (non-nil once recorded)
	ifacesPre      []string
	logsPre        bool
	cniPre         bool
	hostPre        map[string]bool
	logf           func(string, ...any)
	stopOnce       sync.Once
	stopErr        error
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// Missing says what to install when a cluster cannot run here ("" when
// everything is installed).
func Missing() string {
	var miss []string
	for bin, pkg := range map[string]string{"etcd": "etcd-server", "containerd": "containerd", "ctr": "containerd", "runc": "runc", "ip": "iproute2", "iptables": "iptables", "ipset": "ipset"} {
		if _, err := exec.LookPath(bin); err != nil && !slices.Contains(miss, pkg) {
			miss = append(miss, pkg)
		}
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		miss = append(miss, "containernetworking-plugins")
	}
	if len(miss) == 0 {
		return ""
	}
	slices.Sort(miss)
	return "a Kubernetes test cluster needs " + strings.Join(miss, ", ") + ": apt-get install -y etcd-server containerd containernetworking-plugins runc iproute2 iptables ipset (or run make test-deps)"
}

const cniBinDir = "/usr/lib/cni"

// cniCache is libcni's cache of results.
const cniCache = "/var/lib/cni"

// hostPaths are fixed host paths the kubelet (its device-plugin socket)
// and containerd 1.6 (its shims' sockets) use whatever their
// configuration says, deepest first: Stop removes those Start did not
// find (directories only when empty).
var hostPaths = []string{
	"/var/lib/kubelet/device-plugins/kubelet.sock",
	"/var/lib/kubelet/device-plugins",
	"/var/lib/kubelet",
	"/run/containerd/s",
	"/run/containerd",
}

// Start assembles and starts a cluster and waits until its node is Ready.
// On error, everything it started is stopped and removed again.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("kcluster: only root can run containerd and the kubelet")
	}
	if m := Missing(); m != "" {
		return nil, errors.New("kcluster: " + m)
	}
	c := &Cluster{Timings: map[string]time.Duration{}, logf: o.Log}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	t0 := time.Now()
	bins, err := binaries(ctx, o, c.logf)
	if err != nil {
		return nil, err
	}
	c.Timings["binaries"] = time.Since(t0)
	if err := c.start(ctx, o, bins); err != nil {
		if serr := c.Stop(); serr != nil {
			err = fmt.Errorf("%w (and stopping: %v)", err, serr)
		}
		return nil, err
	}
	c.Timings["start"] = time.Since(t0)
	return c, nil
}

// Binaries are the programs tools/k8s builds.
var Binaries = []string{"kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager"}

// EnsureBinaries builds the cluster's binaries into the cache directory
// o names unless they are there, and returns that directory: `make test`
// runs it before the e2e tests, so a cold build is not paid inside their
// time limit.
func EnsureBinaries(ctx context.Context, o Options) (string, error) {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return binaries(ctx, o, logf)
}

// binaries returns the directory holding Binaries, building them when
// needed.
func binaries(ctx context.Context, o Options, logf func(string, ...any)) (string, error) {
	have := func(dir string) bool {
		for _, b := range Binaries {
			if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	return cached(ctx, cachedBuild{
		binDir: o.BinDir, cacheDir: o.CacheDir, toolsDir: o.ToolsDir, logf: logf,
		what: strings.Join(Binaries, ", "), cacheName: "kcluster", version: Version, tools: "k8s",
		cost: "minutes on a cold cache", have: have, build: BuildBinaries,
	})
}

// cachedBuild is one set of binaries built from a tools module into the
// user cache once: the cluster's own, agent-sandbox's controller.
type cachedBuild struct {
	binDir, cacheDir, toolsDir string
	logf                       func(string, ...any)
	what, cacheName, version   string
	tools, cost                string
	have                       func(dir string) bool
	build                      func(ctx context.Context, toolsDir, outDir string) error
}

// cached returns the directory holding c's binaries: binDir as given (it
// must hold them), else the cache directory, built there from
// tools/c.tools unless a complete build is there already.
func cached(ctx context.Context, c cachedBuild) (string, error) {
	if c.binDir != "" {
		if !c.have(c.binDir) {
			return "", fmt.Errorf("kcluster: %s lacks one of %s", c.binDir, c.what)
		}
		return c.binDir, nil
	}
	dir := c.cacheDir
	if dir == "" {
		uc, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(uc, "sandbox-agent", c.cacheName, c.version)
	}
	if c.have(dir) {
		return dir, nil
	}
	tools := c.toolsDir
	if tools == "" {
		var err error
		if tools, err = findTools(c.tools); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	c.logf("building %s %s into %s (%s)", c.what, c.version, dir, c.cost)
	if err := c.build(ctx, tools, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// findTools finds tools/NAME (a module of its own) from the working
// directory upwards.
func findTools(name string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "tools", name, "go.mod")); err == nil {
			return filepath.Join(d, "tools", name), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("kcluster: tools/%s not found above %s: set ToolsDir or BinDir in the options", name, wd)
		}
	}
}

// LDFlags are the linker flags tools/k8s is built with (the version the
// node and the apiserver report).
const LDFlags = "-s -w -X k8s.io/component-base/version.gitVersion=" + Version +
	" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" +
	" -X k8s.io/component-base/version.gitTreeState=clean"

// BuildBinaries builds Binaries from toolsDir (tools/k8s) into outDir, in
// one go build, statically (CGO_ENABLED=0).
func BuildBinaries(ctx context.Context, toolsDir, outDir string) error {
	tmp, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	args := []string{"build", "-trimpath", "-ldflags", LDFlags, "-o", tmp + "/"}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = toolsDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kcluster: build tools/k8s: %w: %s", err, out)
	}
	for _, b := range Binaries {
		if err := os.Rename(filepath.Join(tmp, b), filepath.Join(outDir, b)); err != nil {
			return err
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// hostIP is the IPv4 address of the interface of the default route (else
// of the first up, non-loopback interface).
func hostIP() (net.IP, error) {
	var ifname string
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 2 && f[1] == "00000000" {
				ifname = f[0]
				break
			}
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || (ifname != "" && i.Name != ifname) {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.To4(), nil
			}
		}
	}
	return nil, errors.New("kcluster: no IPv4 address on a non-loopback interface for the node")
}

// gatewayHolder names the interface that has PodGateway, or "".
func gatewayHolder() string {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == PodGateway {
				return i.Name
			}
		}
	}
	return ""
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Cluster) start(ctx context.Context, o Options, bins string) error {
	dir, err := os.MkdirTemp("", "oac-kcluster-")
	if err != nil {
		return err
	}
	c.Dir = dir
	id := strings.TrimPrefix(filepath.Base(dir), "oac-kcluster-")
	c.bridge = BridgePrefix + randHex(4)
	c.cgroupRoot = "/oac-kcluster-" + id
	c.NodeName = "oac-kcluster-" + strings.ToLower(id)
	c.ifacesPre = hostclean.Interfaces()
	c.chainsPre = hostclean.Chains(iptablesTables...)
	c.netnsPre = netnsList()
	if _, err := os.Stat(containerLogs); err == nil {
		c.logsPre = true
	}
	if _, err := os.Stat(cniCache); err == nil {
		c.cniPre = true
	}
	if _, err := os.Stat(HostPathPVDir); err == nil {
		c.hostPathDirPre = true
	}
	c.hostPathPre = append([]string{}, hostPathPVs()...)
	c.hostPre = map[string]bool{}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			c.hostPre[p] = true
		}
	}
	// Two clusters' bridges on one subnet break both: a Pod's packets to
	// the node get their answers through the other bridge.
	if other := gatewayHolder(); other != "" {
		return fmt.Errorf("kcluster: interface %s already has %s, the Pods' gateway: another test cluster runs on this machine; run one at a time", other, PodGateway)
	}
	ip, err := hostIP()
	if err != nil {
		return err
	}
	c.NodeIP = ip.String()
	ports, err := freePorts(7)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, kubeletPort, healthzPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	schedPort, cmPort := ports[5], ports[6]
	for _, d := range []string{"pki", "etcd", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins", "logs", "users"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	t := time.Now()
	p, err := newPKI(filepath.Join(dir, "pki"), []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP("198.18.1.1"), ip}, ip, c.NodeName)
	if err != nil {
		return fmt.Errorf("kcluster: certificates: %w", err)
	}
	c.CA = p.caPEM
	c.pki = p
	c.Token = randHex(24)
	tokens := filepath.Join(dir, "pki", "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.Token+",oac-admin,oac-admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	c.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, "oac-admin", map[string]any{"token": c.Token}); err != nil {
		return err
	}
	c.Timings["pki"] = time.Since(t)

	// etcd.
	t = time.Now()
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	if err := c.spawn("etcd", "etcd",
		"--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn",
		"--quota-backend-bytes", strconv.Itoa(1<<30),
	); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "etcd", 30*time.Second, func() error {
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return err
	}
	c.Timings["etcd"] = time.Since(t)

	// containerd and the CNI network.
	t = time.Now()
	cd := filepath.Join(dir, "containerd")
	c.ctrSock = filepath.Join(cd, "containerd.sock")
	cni := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"oac-kcluster","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":false,"hairpinMode":false,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		c.bridge, PodSubnet, filepath.Join(dir, "cni", "ipam"))
	if err := os.WriteFile(filepath.Join(dir, "cni", "net.d", "10-oac-kcluster.conflist"), []byte(cni+"\n"), 0o644); err != nil {
		return err
	}
	// The bridge exists from the start, not from the first Pod: what a
	// Pod leaves on the host is then told apart from the cluster itself
	// (the bridge plugin takes a bridge that exists).
	if out, err := exec.Command("ip", "link", "add", "name", c.bridge, "type", "bridge").CombinedOutput(); err != nil {
		return fmt.Errorf("kcluster: make the CNI bridge %s: %v: %s", c.bridge, err, out)
	}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[8]q
        SystemdCgroup = false
`, filepath.Join(cd, "root"), filepath.Join(cd, "state"), c.ctrSock, filepath.Join(cd, "opt"),
		PauseImage, cniBinDir, filepath.Join(dir, "cni", "net.d"), filepath.Join(cd, "runc"))
	ccfg := filepath.Join(cd, "config.toml")
	if err := os.WriteFile(ccfg, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := c.spawn("containerd", "containerd", "--config", ccfg, "--log-level", "warn"); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd", 30*time.Second, func() error {
		_, err := c.ctr(ctx, "version")
		return err
	}); err != nil {
		return err
	}
	c.Timings["containerd"] = time.Since(t)

	// The pause image, built and imported while the apiserver starts.
	t = time.Now()
	pauseErr := make(chan error, 1)
	go func() {
		bin, err := buildPause(ctx, dir)
		if err == nil {
			var b []byte
			if b, err = os.ReadFile(bin); err == nil {
				archive := filepath.Join(dir, "pause.oci.tar")
				if err = WriteOCIArchive(archive, PauseImage, []string{"/pause"}, []File{{Path: "pause", Mode: 0o755, Data: b}}); err == nil {
					err = c.ImportImage(ctx, archive)
				}
			}
		}
		pauseErr <- err
	}()

	// The apiserver.
	if err := c.spawn("kube-apiserver", filepath.Join(bins, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(apiPort),
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
		"--tls-cert-file", p.serverCert, "--tls-private-key-file", p.serverKey,
		"--client-ca-file", p.caFile,
		"--token-auth-file", tokens,
		"--authorization-mode", "Node,RBAC",
		"--service-cluster-ip-range", ServiceSubnet,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", p.saPub,
		"--service-account-signing-key-file", p.saKey,
		"--enable-admission-plugins", "NodeRestriction",
		"--kubelet-preferred-address-types", "InternalIP",
		"--kubelet-client-certificate", p.kubeletClient, "--kubelet-client-key", p.kubeletClKey,
		"--kubelet-certificate-authority", p.caFile,
		"--requestheader-client-ca-file", p.frontCAFile,
		"--requestheader-allowed-names", "front-proxy-client",
		"--requestheader-username-headers", "X-Remote-User",
		"--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--proxy-client-cert-file", p.proxyClient, "--proxy-client-key-file", p.proxyClKey,
		"--allow-privileged=true",
		"--cert-dir", filepath.Join(dir, "pki", "apiserver-generated"),
	); err != nil {
		return err
	}
	// Ready: every post-start hook (RBAC's bootstrap roles among them)
	// has run.
	if err := c.waitFor(ctx, "kube-apiserver", 90*time.Second, func() error {
		return c.Get(ctx, "/readyz", nil)
	}); err != nil {
		return err
	}
	c.Timings["apiserver"] = time.Since(t)

	// The scheduler, the controller manager and the default StorageClass.
	t = time.Now()
	if err := c.startControlPlane(bins, p, schedPort, cmPort); err != nil {
		return err
	}
	if err := c.createStorageClass(ctx); err != nil {
		return fmt.Errorf("kcluster: storage class: %w", err)
	}
	if err := <-pauseErr; err != nil {
		return fmt.Errorf("kcluster: pause image: %w", err)
	}

	// The kubelet, as the node (system:node:NAME in system:nodes: the
	// Node authorizer and NodeRestriction confine it to its own node and
	// pods).
	tk := time.Now()
	kubeletKC, err := c.componentKubeconfig("kubelet", "system:node:"+c.NodeName, "system:nodes")
	if err != nil {
		return err
	}
	if err := makeCgroupRoot(c.cgroupRoot); err != nil {
		return err
	}
	kcfg, err := json.MarshalIndent(map[string]any{
		"kind":                        "KubeletConfiguration",
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"failCgroupV1":                false,
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  c.cgroupRoot,
		"failSwapOn":                  false,
		"containerRuntimeEndpoint":    "unix://" + c.ctrSock,
		"address":                     c.NodeIP,
		"port":                        kubeletPort,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 healthzPort,
		"readOnlyPort":                0,
		"tlsCertFile":                 p.kubeletServing,
		"tlsPrivateKeyFile":           p.kubeletSvKey,
		"podLogsDir":                  filepath.Join(dir, "pod-logs"),
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		// The node's disk is the machine's: the kubelet's defaults evict
		// every Pod below 15% free (imagefs), which a build cache on a
		// large disk reaches while the tests need a few hundred MiB. All
		// five signals are given: one left out would be zero.
		"evictionHard": map[string]string{
			"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
			"nodefs.inodesFree": "1%", "imagefs.inodesFree": "1%",
		},
		"registerNode": true,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": p.caFile},
		},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
	}, "", "  ")
	if err != nil {
		return err
	}
	kcfgFile := filepath.Join(dir, "kubelet-config.yaml")
	if err := os.WriteFile(kcfgFile, kcfg, 0o600); err != nil {
		return err
	}
	if err := c.spawn("kubelet", filepath.Join(bins, "kubelet"),
		"--config", kcfgFile,
		"--kubeconfig", kubeletKC,
		"--root-dir", filepath.Join(dir, "kubelet"),
		"--cert-dir", filepath.Join(dir, "kubelet", "pki"),
		"--volume-plugin-dir", filepath.Join(dir, "volume-plugins"),
		"--hostname-override", c.NodeName,
		"--node-ip", c.NodeIP,
	); err != nil {
		return err
	}
	timeout := o.ReadyTimeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	if err := c.waitHealthy(ctx, "kube-scheduler", schedPort); err != nil {
		return err
	}
	if err := c.waitHealthy(ctx, "kube-controller-manager", cmPort); err != nil {
		return err
	}
	c.Timings["control-plane"] = time.Since(t)
	if err := c.waitFor(ctx, "kubelet (node Ready)", timeout, c.nodeReady); err != nil {
		return err
	}
	c.Timings["kubelet"] = time.Since(tk)
	// Ready for a Pod with no nodeName in namespace default: the node
	// lifecycle controller has lifted the not-ready taint and the
	// service-account controller has made default's ServiceAccount.
	t = time.Now()
	if err := c.waitFor(ctx, "kube-controller-manager (node schedulable)", timeout, c.nodeSchedulable); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "kube-controller-manager (default ServiceAccount)", timeout, c.defaultServiceAccount); err != nil {
		return err
	}
	c.Timings["schedulable"] = time.Since(t)
	return nil
}

func (c *Cluster) nodeReady() error {
	var node struct {
		Status struct {
			Conditions []struct {
				Type, Status, Reason, Message string
			}
		}
	}
	if err := c.Get(context.Background(), "/api/v1/nodes/"+c.NodeName, &node); err != nil {
		return err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == "Ready" {
			if cond.Status == "True" {
				return nil
			}
			return fmt.Errorf("node not Ready: %s: %s", cond.Reason, cond.Message)
		}
	}
	return errors.New("node has no Ready condition yet")
}

// writeKubeconfig writes a kubeconfig of the cluster for the user userName
// whose credentials are user (a token, or certificate and key data).
func (c *Cluster) writeKubeconfig(path, userName string, user map[string]any) error {
	b, err := json.MarshalIndent(map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "oac-kcluster",
		"clusters": []any{map[string]any{"name": "oac-kcluster", "cluster": map[string]any{
			"server": c.URL, "certificate-authority-data": base64.StdEncoding.EncodeToString(c.CA),
		}}},
		"users": []any{map[string]any{"name": userName, "user": user}},
		"contexts": []any{map[string]any{"name": "oac-kcluster", "context": map[string]any{
			"cluster": "oac-kcluster", "user": userName,
		}}},
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// spawn starts a daemon in its own process group, logging to logs/NAME.log.
func (c *Cluster) spawn(name, bin string, args ...string) error {
	logPath := filepath.Join(c.Dir, "logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kcluster: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.procs = append(c.procs, p)
	c.logf("started %s (pid %d)", name, cmd.Process.Pid)
	return nil
}

func (c *Cluster) proc(name string) *proc {
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// LogTail is the end of a daemon's log (etcd, containerd, kube-apiserver,
// kube-scheduler, kube-controller-manager, kubelet,
// agent-sandbox-controller), for test failures.
func (c *Cluster) LogTail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// waitFor polls check until it succeeds, the daemon exits, or timeout.
func (c *Cluster) waitFor(ctx context.Context, name string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	p := c.proc(strings.Fields(name)[0])
	var done chan struct{}
	if p != nil {
		done = p.done
	}
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("kcluster: %s exited at start: %s", name, c.LogTail(p.name, 3000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tail := ""
			if p != nil {
				tail = c.LogTail(p.name, 3000)
			}
			return fmt.Errorf("kcluster: %s not ready within %s: %v\n%s", name, timeout, err, tail)
		}
	}
}

// PIDs returns the pids of the daemons the cluster runs, by name.
func (c *Cluster) PIDs() map[string]int {
	m := map[string]int{}
	for _, p := range c.procs {
		m[p.name] = p.cmd.Process.Pid
	}
	return m
}

// RSS returns the resident memory (bytes) of each daemon, by name.
func (c *Cluster) RSS() map[string]int64 {
	m := map[string]int64{}
	for name, pid := range c.PIDs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				m[name] = kb * 1024
			}
		}
	}
	return m
}

// ctr runs containerd's client against the private containerd, in the
// k8s.io namespace.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.ctrSock, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// ImportImage imports an OCI image archive (whose index names the image,
// as WriteOCIArchive writes) into the cluster's containerd, for Pods with
// imagePullPolicy: Never.
func (c *Cluster) ImportImage(ctx context.Context, tarball string) error {
	_, err := c.ctr(ctx, "images", "import", tarball)
	return err
}

// Do sends a request to the API with the cluster's token; body (when not
// nil) is sent as JSON and a 2xx answer decoded into out (when not nil).
// Another status is an *APIError.
func (c *Cluster) Do(ctx context.Context, method, path string, body, out any) error {
	return do(ctx, c.client, c.URL, c.Token, method, path, body, out)
}

// do sends a request to the API at url with client (and token, when not
// empty).
func do(ctx context.Context, client *http.Client, url, token, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url+path, r)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// Get is Do with GET.
func (c *Cluster) Get(ctx context.Context, path string, out any) error {
	return c.Do(ctx, http.MethodGet, path, nil, out)
}

// APIError is an answer of the API that is not 2xx.
type APIError struct {
	Status int
	Body   string
}

func (e *APIError) Error() string { return fmt.Sprintf("API status %d: %s", e.Status, e.Body) }

// IsNotFound reports whether err is the API's 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// Stop deletes the cluster's pods, ends its daemons and removes all that
// it made (see the package doc). It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	if c.Dir == "" {
		// Start failed before it made anything (the directory is its
		// first step, and what the host had before is recorded right
		// after): there is nothing to remove, and an empty Dir must not
		// match every shim's command line.
		return nil
	}
	var errs []error
	ctx := context.Background()
	// The controllers (agent-sandbox's too, whose warm pools make Pods)
	// and the scheduler first, so that nothing makes pods again; then
	// the pods, through the kubelet, so that CNI tears their networks
	// down.
	for _, name := range []string{AgentSandboxController, "kube-controller-manager", "kube-scheduler"} {
		if p := c.proc(name); p != nil {
			if err := p.stop(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if k := c.proc("kubelet"); k != nil && c.proc("kube-apiserver") != nil && !exited(k) {
		c.deletePods(ctx, 60*time.Second)
	}
	// Then the daemons, newest first.
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if p.name == "containerd" {
			// Whatever the kubelet left: tasks and containers.
			if err := c.removeContainers(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if err := p.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	// Shims outlive containerd: end those of this containerd.
	killShims(c.Dir)
	for _, ns := range netnsList() {
		if !slices.Contains(c.netnsPre, ns) && strings.HasPrefix(ns, "cni-") {
			p := filepath.Join("/var/run/netns", ns)
			_ = unix.Unmount(p, unix.MNT_DETACH)
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// The bridge (the pods' veths went with their network namespaces).
	for _, name := range hostclean.Interfaces() {
		if !slices.Contains(c.ifacesPre, name) && name == c.bridge {
			if out, err := exec.Command("ip", "link", "delete", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("remove interface %s: %v: %s", name, err, out))
			}
		}
	}
	for _, ch := range hostclean.Chains(iptablesTables...) {
		table, chain, _ := strings.Cut(ch, " ")
		if !slices.Contains(c.chainsPre, ch) && (strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "CNI-")) {
			_ = exec.Command("iptables", "-t", table, "-F", chain).Run()
		}
	}
	for _, ch := range hostclean.Chains(iptablesTables...) {
		table, chain, _ := strings.Cut(ch, " ")
		if !slices.Contains(c.chainsPre, ch) && (strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "CNI-")) {
			// Rules of built-in chains that jump to it go first.
			removeJumps(table, chain)
			if out, err := exec.Command("iptables", "-t", table, "-X", chain).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("remove iptables chain %s: %v: %s", ch, err, out))
			}
		}
	}
	// The enforcer's ipsets, once no rule matches on them.
	if err := c.removeIPSets(); err != nil {
		errs = append(errs, err)
	}
	if c.Dir != "" {
		hostclean.UnmountUnder(c.Dir)
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if c.cgroupRoot != "" {
		removeCgroupTree(c.cgroupRoot)
	}
	if err := c.removeHostPathPVs(); err != nil {
		errs = append(errs, err)
	}
	// The kubelet's links to its containers' logs: it removes a link
	// with its container, which Stop may have done instead.
	for _, l := range logLinks(c.Dir) {
		if err := os.Remove(l); err != nil {
			errs = append(errs, err)
		}
	}
	if !c.logsPre {
		_ = os.Remove(containerLogs) // only if empty
	}
	// libcni's result cache (containerd 1.6 cannot move it): this
	// network's entries, and the directories when Start made them.
	res, _ := filepath.Glob(filepath.Join(cniCache, "results", "oac-kcluster-*"))
	for _, r := range res {
		_ = os.Remove(r)
	}
	if !c.cniPre {
		_ = os.Remove(filepath.Join(cniCache, "results"))
		_ = os.Remove(cniCache)
	}
	// Host paths the kubelet and containerd use whatever their
	// configuration says, when Start made them (deepest first; a
	// directory only when empty).
	if c.hostPre != nil {
		for _, p := range hostPaths {
			if !c.hostPre[p] {
				_ = os.Remove(p)
			}
		}
	}
	return errors.Join(errs...)
}

func exited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stop() error {
	if exited(p) {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("kcluster: %s did not stop within 20s of SIGTERM; killed", p.name)
	}
}

// deletePods deletes every pod and waits until the kubelet has removed
// them.
func (c *Cluster) deletePods(ctx context.Context, timeout time.Duration) {
	var list struct {
		Items []struct {
			Metadata struct{ Name, Namespace string }
		}
	}
	if err := c.Get(ctx, "/api/v1/pods", &list); err != nil {
		return
	}
	for _, it := range list.Items {
		_ = c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+it.Metadata.Namespace+"/pods/"+it.Metadata.Name,
			map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1}, nil)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := c.Get(ctx, "/api/v1/pods", &list); err != nil || len(list.Items) == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The kubelet stops sandboxes after the pods are gone from the API.
	for time.Now().Before(deadline) {
		out, err := c.ctr(ctx, "tasks", "list", "-q")
		if err != nil || strings.TrimSpace(out) == "" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// removeContainers kills and deletes every task and container left in
// the k8s.io namespace of the private containerd.
func (c *Cluster) removeContainers(ctx context.Context) error {
	out, err := c.ctr(ctx, "containers", "list", "-q")
	if err != nil {
		return nil // containerd is gone already
	}
	var errs []error
	for _, id := range strings.Fields(out) {
		_, _ = c.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		_, _ = c.ctr(ctx, "tasks", "delete", "--force", id)
		if _, err := c.ctr(ctx, "containers", "delete", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killShims ends containerd-shim processes whose command line names dir
// (this containerd's state).
func killShims(dir string) {
	if dir == "" {
		return
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		if strings.Contains(cl, "containerd-shim") && strings.Contains(cl, dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// containerLogs is where the kubelet links its containers' logs, whatever
// its configuration says.
const containerLogs = "/var/log/containers"

// logLinks lists the links in containerLogs to files below dir.
func logLinks(dir string) []string {
	if dir == "" {
		return nil
	}
	ents, _ := os.ReadDir(containerLogs)
	var out []string
	for _, e := range ents {
		p := filepath.Join(containerLogs, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

func netnsList() []string {
	ents, _ := os.ReadDir("/var/run/netns")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// removeJumps deletes the rules of table that jump to chain, by their
// number (a rule's spec cannot be fed back to -D when a comment in it has
// spaces), last first so the numbers before stay right.
func removeJumps(table, chain string) {
	b, err := exec.Command("iptables", "-w", "-t", table, "-S").Output()
	if err != nil {
		return
	}
	type jump struct {
		chain string
		n     int
	}
	var jumps []jump
	num := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		num[f[1]]++
		if i := slices.Index(f, "-j"); i > 0 && i+1 < len(f) && f[i+1] == chain {
			jumps = append(jumps, jump{f[1], num[f[1]]})
		}
	}
	for i := len(jumps) - 1; i >= 0; i-- {
		_ = exec.Command("iptables", "-w", "-t", table, "-D", jumps[i].chain, strconv.Itoa(jumps[i].n)).Run()
	}
}

// iptablesTables are the tables the CNI plugins and the kubelet add chains to.
var iptablesTables = []string{"filter", "nat", "mangle"}

// cgroupHierarchies are the cgroup v1 hierarchies (and the unified one).
func cgroupHierarchies() []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	var out []string
	for _, r := range roots {
		if st, err := os.Stat(r); err == nil && st.IsDir() {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		out = []string{"/sys/fs/cgroup"}
	}
	return out
}

// makeCgroupRoot creates the kubelet's cgroup root in every hierarchy
// (the kubelet checks that it exists); cpuset's gets its parent's cpus
// and mems.
func makeCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		p := filepath.Join(h, root)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			continue // a hierarchy that refuses children (e.g. a named one)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				_ = os.WriteFile(filepath.Join(p, f), b, 0o644)
			}
		}
	}
	return nil
}

// removeCgroupTree removes root and everything below it from every
// hierarchy, deepest first (they are empty once the pods are gone).
func removeCgroupTree(root string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			_ = unix.Rmdir(d)
		}
	}
}

// Leftovers lists what a stopped cluster left behind (processes, mounts,
// interfaces, network namespaces, iptables chains, ipsets, the directory, host
// paths, hostPath volumes, cgroups), for tests.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, p := range c.procs {
		if err := syscall.Kill(p.cmd.Process.Pid, 0); err == nil {
			out = append(out, fmt.Sprintf("process %s (pid %d)", p.name, p.cmd.Process.Pid))
		}
	}
	if c.Dir != "" {
		for _, m := range hostclean.MountsUnder(c.Dir) {
			out = append(out, "mount "+m)
		}
		if _, err := os.Stat(c.Dir); err == nil {
			out = append(out, "directory "+c.Dir)
		}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && bytes.Contains(b, []byte(c.Dir)) {
				out = append(out, "process "+e.Name()+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
		}
	}
	for _, i := range hostclean.Interfaces() {
		if i == c.bridge {
			out = append(out, "interface "+i)
		}
	}
	for _, ns := range netnsList() {
		if !slices.Contains(c.netnsPre, ns) && strings.HasPrefix(ns, "cni-") {
			out = append(out, "netns "+ns)
		}
	}
	if c.Dir != "" { // Start recorded the chains right after making Dir
		for _, ch := range hostclean.Chains(iptablesTables...) {
			_, chain, _ := strings.Cut(ch, " ")
			if !slices.Contains(c.chainsPre, ch) && (strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "CNI-")) {
				out = append(out, "iptables chain "+ch)
			}
		}
	}
	for _, s := range c.enforcerIPSets() {
		out = append(out, "ipset "+s)
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil && c.hostPre != nil && !c.hostPre[p] {
			out = append(out, "host path "+p)
		}
	}
	for _, l := range logLinks(c.Dir) {
		out = append(out, "log link "+l)
	}
	if _, err := os.Stat(containerLogs); err == nil && c.Dir != "" && !c.logsPre {
		out = append(out, "directory "+containerLogs)
	}
	if c.hostPathPre != nil {
		for _, name := range hostPathPVs() {
			if !slices.Contains(c.hostPathPre, name) {
				out = append(out, "hostPath volume "+filepath.Join(HostPathPVDir, name))
			}
		}
		if _, err := os.Stat(HostPathPVDir); err == nil && !c.hostPathDirPre {
			out = append(out, "directory "+HostPathPVDir)
		}
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, c.cgroupRoot)); c.cgroupRoot != "" && err == nil {
			out = append(out, "cgroup "+filepath.Join(h, c.cgroupRoot))
		}
	}
	return out
}
