package docker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// AgentCaps are the capabilities added back after --cap-drop ALL: the
// ones the OCI provider measured the agent needs (setuid/setgid to start
// the daemon as 1000:1000, kill to stop it).
var AgentCaps = []string{"KILL", "SETGID", "SETUID"}

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
	Debug             bool
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
	a = append(a,
		"--security-opt", "no-new-privileges",
		"--pids-limit", fmt.Sprint(kit.PidsLimit),
		"--tmpfs", fmt.Sprintf("/tmp:rw,nosuid,nodev,size=%dm,mode=1777", kit.TmpSizeMiB),
		"--tmpfs", fmt.Sprintf("/run:rw,nosuid,nodev,size=%dm,mode=755", kit.RunSizeMiB),
		"--mount", "type=bind,src="+c.RunDir+",dst="+kit.GuestRunDir,
		"--mount", "type=bind,src="+c.AgentPath+",dst="+kit.GuestAgentPath+",readonly",
	)
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
		return fmt.Errorf("%w: docker: %s: %s (docker pull it first; the provider never pulls)", provider.ErrInvalidSpec, what, msg)
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
