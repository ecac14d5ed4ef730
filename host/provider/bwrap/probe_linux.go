package bwrap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

// The capability probe: on a host whose kernel enforces AppArmor, a
// profile attached to bwrap may run bwrap's children without capabilities
// (Ubuntu's bwrap-userns-restrict sends them to unpriv_bwrap, whose
// "audit deny capability" the kernel enforces), while the guest agent
// needs them in its own namespaces: it chowns the runtime files, mounts,
// binds port 53, loads nftables. Seen in a VM enforcing that profile, the
// agent failed its bootstrap after the sandbox was created
// ("chown: operation not permitted", sandbox_io_failed). So before
// anything is created, oac-shim runs bwrap once as the provider does,
// with itself as the child (probeEnv), and the child reports its label
// and whether the kernel let it mount a tmpfs in its own namespace.

// probeEnv marks oac-shim re-executed by bwrap as the probe's child.
const probeEnv = "OAC_BWRAP_CAPS_PROBE"

// probePath is where the probe's child is bound in its sandbox.
const probePath = "/run/oac-caps-probe"

func init() {
	// bwrap's child is PID 1 of its own pid namespace (--as-pid-1): the
	// variable alone never turns an oac-shim into the probe.
	if os.Getenv(probeEnv) == "1" && os.Getpid() == 1 {
		os.Exit(capsProbeChild())
	}
}

// probeReport is what the child writes on stdout, one JSON object.
type probeReport struct {
	Label string `json:"label"`
	// Mount is "" when the mount succeeded, else the kernel's refusal.
	Mount string `json:"mount,omitempty"`
	// Denied: the refusal was EPERM or EACCES (a permission, not a
	// missing filesystem).
	Denied bool `json:"denied,omitempty"`
}

func capsProbeChild() int {
	var r probeReport
	if b, err := os.ReadFile("/proc/self/attr/current"); err == nil {
		r.Label = strings.TrimSpace(strings.TrimRight(string(b), "\x00"))
	}
	const dir = "/tmp/m"
	err := os.Mkdir(dir, 0o700)
	if err == nil {
		err = unix.Mount("oac-probe", dir, "tmpfs", 0, "size=64k")
	}
	if err != nil {
		r.Mount = err.Error()
		r.Denied = errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// appArmorEnabled reports whether this kernel enforces AppArmor.
func appArmorEnabled() bool {
	b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	return err == nil && strings.TrimSpace(string(b)) == "Y"
}

// probeResult is the probe's verdict on one bwrap binary.
type probeResult struct {
	// Ran: bwrap started the child and it reported.
	Ran bool
	// Label is the AppArmor label the child ran under.
	Label string
	// Denied is the kernel's refusal of the child's mount ("" none).
	Denied string
	// Err says why the probe did not run (bwrap's own error).
	Err string
}

var probeCache sync.Map // bwrap path -> probeResult

// probeChildCaps runs the probe with the bwrap at path (once per path and
// process): check and run ask the same question.
func probeChildCaps(path string) probeResult {
	if r, ok := probeCache.Load(path); ok {
		return r.(probeResult)
	}
	r := runProbe(path)
	probeCache.Store(path, r)
	return r
}

func runProbe(bwrap string) probeResult {
	exe, err := os.Executable()
	if err != nil {
		return probeResult{Err: "find oac-shim: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bwrap, probeArgs(exe, kit.HostRoot())...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var rep probeReport
	if jerr := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &rep); jerr != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" && err != nil {
			msg = err.Error()
		}
		return probeResult{Err: fmt.Sprintf("%s did not run the capability probe: %s", bwrap, msg)}
	}
	r := probeResult{Ran: true, Label: rep.Label}
	if rep.Denied {
		r.Denied = "mount: " + rep.Mount
	}
	return r
}

// probeArgs runs exe as the child the way the provider runs the agent:
// its own user namespace with every capability in it, PID 1 of its own
// pid namespace, no new privileges (bwrap's), the default root's host
// directories.
func probeArgs(exe string, host []kit.HostEntry) []string {
	a := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
		"--die-with-parent", "--as-pid-1", "--new-session", "--clearenv",
		"--uid", "0", "--gid", "0", "--cap-add", "ALL",
	}
	for _, e := range host {
		if e.Symlink != "" {
			a = append(a, "--symlink", e.Symlink, e.Path)
		} else {
			a = append(a, "--ro-bind", e.Path, e.Path)
		}
	}
	return append(a,
		"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",
		"--ro-bind", exe, probePath,
		"--setenv", probeEnv, "1",
		"--", probePath)
}
