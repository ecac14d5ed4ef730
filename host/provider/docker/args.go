package docker

import (
	"encoding/csv"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// AgentCaps are the capabilities added back after --cap-drop ALL, sorted:
// the hosted contract's (kit.AgentCaps, which says why each is needed) and
// SETFCAP, with which (and SETUID and SETGID) the agent maps the guest's
// ids into the nested user namespace that gives the daemon a mount
// namespace of its own (Linux 5.12 and later require it to map id 0), as
// under the oci provider.
var AgentCaps = func() []string {
	caps := append(slices.Clone(kit.AgentCaps), "SETFCAP")
	slices.Sort(caps)
	return caps
}()

// ContainerName is the engine's name of a sandbox's container.
func ContainerName(name string) string { return "oac-" + name }

// runConfig is everything `docker run` depends on.
type runConfig struct {
	Name     string // sandbox name
	Image    string
	Hostname string
	// RunDir is the host directory mounted at /run/oac (the transport
	// socket); AgentPath the host's oac-guest, mounted read-only.
	RunDir, AgentPath string
	// ResolvConf is a host file mounted read-only at /etc/resolv.conf:
	// the agent's resolver (docker's own would name the host's).
	ResolvConf string
	// Volumes are host directories bound read-write at /home or
	// /environment (provider.VolumeDirs); the others get a tmpfs.
	Volumes map[string]string
	// Installs are host binaries bound read-only at /usr/local/bin/NAME,
	// as name -> host path pairs in name order.
	Installs [][2]string
	// Seccomp is a host file holding the container's seccomp profile
	// (seccompProfile): the engine's default plus what the workload
	// launcher needs; "" leaves the engine's default.
	Seccomp string
	Debug   bool
}

// mountArg is the value of --mount for the fields given as key=value,
// quoted the way the docker client's CSV parser reads it (a path with a
// comma or a quote stays one field).
func mountArg(fields ...string) string {
	var b strings.Builder
	w := csv.NewWriter(&b)
	_ = w.Write(fields)
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// runArgs returns the arguments of `docker run` (without "docker").
func runArgs(c runConfig) []string {
	a := []string{
		"run", "--rm", "--name", ContainerName(c.Name),
		"--label", "oac.sandbox=" + c.Name,
		"--pull", "never",
		"--user", "0:0",
		"--network", "none",
		"--read-only",
		"--cap-drop", "ALL",
	}
	for _, c := range AgentCaps {
		a = append(a, "--cap-add", c)
	}
	a = append(a, "--security-opt", "no-new-privileges")
	if c.Seccomp != "" {
		a = append(a, "--security-opt", "seccomp="+c.Seccomp)
	}
	a = append(a,
		"--pids-limit", fmt.Sprint(kit.PidsLimit),
		"--tmpfs", fmt.Sprintf("/tmp:rw,nosuid,nodev,size=%dm,mode=1777", kit.TmpSizeMiB),
		"--tmpfs", fmt.Sprintf("/run:rw,nosuid,nodev,size=%dm,mode=755", kit.RunSizeMiB),
		"--mount", mountArg("type=bind", "src="+c.RunDir, "dst="+kit.GuestRunDir),
		"--mount", mountArg("type=bind", "src="+c.AgentPath, "dst="+kit.GuestAgentPath, "readonly"),
	)
	if c.ResolvConf != "" {
		a = append(a, "--mount", mountArg("type=bind", "src="+c.ResolvConf, "dst=/etc/resolv.conf", "readonly"))
	}
	// /home and /environment: writable, owned by guest root, which makes
	// /home/runtime and /environment/workspace for uid 1000 itself.
	for _, d := range provider.VolumeDirs {
		if host, ok := c.Volumes[d]; ok {
			a = append(a, "--mount", mountArg("type=bind", "src="+host, "dst="+d))
		} else {
			a = append(a, "--tmpfs", d+":rw,nosuid,nodev,mode=755")
		}
	}
	for _, in := range c.Installs {
		a = append(a, "--mount", mountArg("type=bind", "src="+in[1], "dst="+kit.GuestInstallDir+"/"+in[0], "readonly"))
	}
	if c.Hostname != "" {
		a = append(a, "--hostname", c.Hostname)
	}
	a = append(a, "--entrypoint", kit.GuestAgentPath, c.Image, "--transport", "unix://"+kit.GuestSocketPath)
	if c.Debug {
		a = append(a, "--debug")
	}
	return a
}

func versionArgs() []string  { return []string{"version", "--format", "{{.Server.Version}}"} }
func securityArgs() []string { return []string{"info", "--format", "{{json .SecurityOptions}}"} }
func imageArgs(image string) []string {
	return []string{"image", "inspect", "--format", "{{.Id}}", image}
}
func killArgs(name string) []string   { return []string{"kill", ContainerName(name)} }
func removeArgs(name string) []string { return []string{"rm", "--force", ContainerName(name)} }

// ErrNoContainer: the engine has no container of that name.
var ErrNoContainer = errors.New("no such container")

// errRemoving: the engine is already removing the container (its --rm).
var errRemoving = errors.New("container removal in progress")

// classify maps a failed docker command to the provider's errors by the
// messages the docker client prints.
func classify(what, out string, err error) error {
	msg := strings.Join(strings.Fields(out), " ")
	if msg == "" {
		msg = err.Error()
	}
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	lower := strings.ToLower(out)
	switch {
	case strings.Contains(lower, "cannot connect to the docker daemon"), strings.Contains(lower, "is the docker daemon running"),
		strings.Contains(lower, "error during connect"), strings.Contains(lower, "permission denied while trying to connect"):
		return fmt.Errorf("%w: docker: no Docker engine reachable: %s", provider.ErrUnavailable, msg)
	case strings.Contains(lower, "no such image"), strings.Contains(lower, "unable to find image"):
		return fmt.Errorf("%w: docker: %s: %s (docker import the image build's rootfs.tar.gz, or docker load an archive, first; the provider never pulls)", provider.ErrInvalidSpec, what, msg)
	case strings.Contains(lower, "removal of container") && strings.Contains(lower, "already in progress"):
		return fmt.Errorf("%w: docker: %s: %s", errRemoving, what, msg)
	case strings.Contains(lower, "no such container"), strings.Contains(lower, "is not running"):
		return fmt.Errorf("%w: docker: %s: %s", ErrNoContainer, what, msg)
	case strings.Contains(lower, "is already in use by container"):
		return fmt.Errorf("%w: docker: %s: %s", provider.ErrExists, what, msg)
	}
	return fmt.Errorf("docker: %s: %s", what, msg)
}

// usernsRemapped reports whether `docker info` SecurityOptions (as JSON)
// say the engine maps container root to an unprivileged host range.
func usernsRemapped(securityOptions string) bool {
	return strings.Contains(securityOptions, "name=userns")
}
