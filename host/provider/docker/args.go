package docker

import (
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
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
	// (kit.ContainerSeccompProfile): the engine's default plus what the workload
	// launcher needs; "" leaves the engine's default.
	Seccomp string
	// AppArmor is the AppArmor profile to run the container under
	// (apparmor.Name where the engine confines with AppArmor); "" leaves
	// the engine's choice (no AppArmor there).
	AppArmor string
	Debug    bool
	// Kept makes a kept sandbox's container (provider.Spec.Keep): made
	// once with `docker create` and started again by each run, never
	// removed by one; its root, /home and /environment (unless a volume
	// replaces them) are its writable layer, which the engine keeps.
	Kept bool
}

// Labels of the engine's objects.
const (
	// LabelSandbox names the sandbox a container was made for.
	LabelSandbox = "oac.sandbox"
	// LabelKept marks a kept sandbox's container ("1").
	LabelKept = "oac.kept"
	// LabelConfig is the digest of a kept container's settings: a run
	// with others cannot reuse it (reset the sandbox to change them).
	LabelConfig = "oac.config"
)

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
	a := []string{"run", "--rm", "--name", ContainerName(c.Name), "--label", LabelSandbox + "=" + c.Name}
	if c.Kept {
		a = []string{"create", "--name", ContainerName(c.Name), "--label", LabelSandbox + "=" + c.Name, "--label", LabelKept + "=1"}
	}
	a = append(a, "--pull", "never", "--user", "0:0", "--network", "none")
	// IPv6 on the container's lo, which an engine turns off in a
	// container with no IPv6 network: the guest captures IPv6 too.
	a = append(a, "--sysctl", "net.ipv6.conf.all.disable_ipv6=0", "--sysctl", "net.ipv6.conf.lo.disable_ipv6=0")
	if !c.Kept {
		a = append(a, "--read-only")
	}
	a = append(a, "--cap-drop", "ALL")
	for _, c := range AgentCaps {
		a = append(a, "--cap-add", c)
	}
	a = append(a, "--security-opt", "no-new-privileges")
	if c.Seccomp != "" {
		a = append(a, "--security-opt", "seccomp="+c.Seccomp)
	}
	// Never unconfined: a profile is only ever named to replace the
	// engine's default with the guest's, which confines as much but for
	// the launcher's mounts.
	if c.AppArmor != "" && c.AppArmor != "unconfined" {
		a = append(a, "--security-opt", "apparmor="+c.AppArmor)
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
		} else if !c.Kept {
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
	if c.Kept {
		// The agent gives /usr/local (but bin and sbin) to uid 1000.
		a = append(a, "--kept")
	}
	return a
}

// createArgs returns the arguments of `docker create` for a kept
// sandbox's container: runArgs' with the digest of its settings as a
// label (the image's reference left out: a container keeps the image it
// was made from, and a moved reference is said, not refused).
func createArgs(c runConfig) []string {
	c.Kept = true
	return withConfigLabel(runArgs(c), configDigest(c))
}

func withConfigLabel(args []string, digest string) []string {
	out := append([]string{}, args[:1]...)
	out = append(out, "--label", LabelConfig+"="+digest)
	return append(out, args[1:]...)
}

// configDigest is the digest of what a kept container's settings depend
// on, but the image.
func configDigest(c runConfig) string {
	c.Image = ""
	c.Kept = true
	h := sha256.New()
	for _, a := range runArgs(c) {
		h.Write([]byte(a))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// startArgs starts a kept sandbox's container, attached as `docker run`
// is.
func startArgs(name string) []string { return []string{"start", "--attach", ContainerName(name)} }

// inspectFormat prints a container's sandbox label, kept label, config
// label, image id and whether it runs, one a line.
const inspectFormat = `{{index .Config.Labels "` + LabelSandbox + `"}}
{{index .Config.Labels "` + LabelKept + `"}}
{{index .Config.Labels "` + LabelConfig + `"}}
{{.Image}}
{{.State.Running}}`

func inspectArgs(name string) []string {
	return []string{"container", "inspect", "--format", inspectFormat, ContainerName(name)}
}

// container is what inspectArgs tells of a container.
type container struct {
	sandbox, config, image string
	kept, running          bool
}

func parseInspect(out string) (container, error) {
	f := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(f) != 5 {
		return container{}, fmt.Errorf("docker: container inspect printed %d lines, want 5", len(f))
	}
	return container{sandbox: f[0], kept: f[1] == "1", config: f[2], image: f[3], running: f[4] == "true"}, nil
}

// stopArgs stops a container at once and waits until it has stopped.
func stopArgs(name string) []string { return []string{"stop", "--time", "0", ContainerName(name)} }

// discardArgs removes a kept container with its anonymous volumes.
func discardArgs(name string) []string {
	return []string{"rm", "--force", "--volumes", ContainerName(name)}
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

// appArmorConfines reports whether `docker info` SecurityOptions (as
// JSON) say the engine confines containers with AppArmor: the engine's
// own report, which holds where the kernel has AppArmor and the engine
// was built with it.
func appArmorConfines(securityOptions string) bool {
	return strings.Contains(securityOptions, "name=apparmor")
}

// usernsRemapped reports whether `docker info` SecurityOptions (as JSON)
// say the engine maps container root to an unprivileged host range.
func usernsRemapped(securityOptions string) bool {
	return strings.Contains(securityOptions, "name=userns")
}
