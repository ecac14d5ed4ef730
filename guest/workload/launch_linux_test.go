package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oac/sandbox-agent/guest/doors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The launcher's tests run this test binary in three parts: as the agent
// (an "agent" child: root, or root of a user namespace of its own with
// only the OCI bundle's capabilities), as
// the launcher (LaunchArg, see TestMain), and as the
// workload: "idle" stands in for oac-sandbox-io, "attack" for a hostile
// daemon that reports what it reached.

// scenario is what one agent run of the launcher found.
type scenario struct {
	AgentCaps string            `json:"agent_caps"`
	Isolated  bool              `json:"isolated"`
	Why       string            `json:"why"`
	Notes     []string          `json:"notes"`
	Attack    map[string]string `json:"attack"`
	// Control is the same attack from a plain uid-1000 process: no
	// launcher, no filter, no mask.
	Control map[string]string `json:"control"`
	Error   string            `json:"error,omitempty"`
}

// env of a scenario: where the workload binary and the secret are.
const (
	envBin    = "OAC_TEST_BIN"
	envSecret = "OAC_TEST_SECRET"
	envTarget = "OAC_TEST_TARGET"
	// envDoors: a directory where the agent opens doors as a platform
	// does (a drive, an interop socket, a socket mounted in) and tells
	// the launcher to close them.
	envDoors = "OAC_TEST_DOORS"
)

// runScenario plays the agent: it starts "oac-sandbox-io" (idle, not
// dumpable), then the "daemon" (attack, the secret masked), and returns
// what the daemon reported.
func runScenario() scenario {
	c := detect(slog.New(slog.NewTextHandler(io.Discard, nil)), effectiveCaps())
	var sc scenario
	sc.Isolated, sc.Why = c.Isolated()
	attackEnv := []string{}
	if root := os.Getenv(envDoors); root != "" {
		env, err := openDoors(root)
		if err != nil {
			sc.Error = "open the doors: " + err.Error()
			return sc
		}
		attackEnv = append(env, envDoors+"="+root)
		c.SetDoors(doors.Plan{Detach: []string{root + "/drive", root + "/docker.sock"}, Cover: []string{root + "/run-wsl"}, DropEnv: []string{"WSL_INTEROP"}})
	}
	sc.AgentCaps = statusField("CapEff")
	bin, secret := os.Getenv(envBin), os.Getenv(envSecret)
	start := func(s Spec, stdout io.Writer) (*exec.Cmd, error) {
		for {
			l, err := c.Command(s)
			if err != nil {
				return nil, err
			}
			l.Cmd.Stdout, l.Cmd.Stderr = stdout, os.Stderr
			err = l.Cmd.Start()
			l.Started()
			if err != nil {
				l.Close()
				sc.Notes = append(sc.Notes, "fell back: "+err.Error())
				if c.Fallback(err) {
					continue
				}
				return nil, err
			}
			notes, err := l.Finish()
			sc.Notes = append(sc.Notes, notes...)
			if err != nil {
				_ = l.Cmd.Wait()
				return nil, err
			}
			return l.Cmd, nil
		}
	}
	idle, err := start(Spec{Name: "oac-sandbox-io", Path: bin, Argv: []string{bin}, Env: []string{childEnv + "=idle", "IDLE_SECRET=in-its-environment"},
		Dir: "/", UID: 1000, GID: 1000, NoDump: true}, nil)
	if err != nil {
		sc.Error = err.Error()
		return sc
	}
	defer func() { _ = idle.Process.Kill(); _ = idle.Wait() }()
	var out bytes.Buffer
	attack, err := start(Spec{Name: "daemon", Path: bin, Argv: []string{bin},
		Env: append([]string{childEnv + "=attack", envSecret + "=" + secret, envTarget + "=" + strconv.Itoa(idle.Process.Pid)}, attackEnv...),
		Dir: "/", UID: 1000, GID: 1000, Mask: []string{secret}}, &out)
	if err != nil {
		sc.Error = err.Error()
		return sc
	}
	_ = attack.Wait()
	if err := json.Unmarshal(out.Bytes(), &sc.Attack); err != nil {
		sc.Error = fmt.Sprintf("attack output %q: %v", out.String(), err)
	}
	control := exec.Command(bin)
	control.Env = append([]string{childEnv + "=attack", envSecret + "=" + secret, envTarget + "=" + strconv.Itoa(idle.Process.Pid)}, attackEnv...)
	control.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	b, err := control.Output()
	if err == nil {
		err = json.Unmarshal(b, &sc.Control)
	}
	if err != nil {
		sc.Error = fmt.Sprintf("control: %v", err)
	}
	return sc
}

// attack is the hostile daemon's side.
func attack() map[string]string {
	secret := os.Getenv(envSecret)
	target := os.Getenv(envTarget)
	res := map[string]string{}
	_, err := os.ReadFile(secret)
	res["read secret"] = errName(err)
	proc := "/proc/" + target
	_, err = os.ReadFile(proc + "/root" + secret)
	res["read secret via proc root"] = errName(err)
	f, err := os.Open(proc + "/mem")
	res["open mem"] = errName(err)
	if err == nil {
		f.Close()
	}
	_, err = os.ReadFile(proc + "/environ")
	res["read environ"] = errName(err)
	_, err = os.ReadDir(proc + "/fd")
	res["list fd"] = errName(err)
	pid, _ := strconv.Atoi(target)
	_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0)
	res["ptrace"] = errnoName(e)
	comm, _ := os.ReadFile(proc + "/comm")
	res["target comm"] = strings.TrimSpace(string(comm))
	for _, k := range []string{"Seccomp", "NoNewPrivs", "CapEff", "CapBnd", "CapAmb"} {
		res[k] = statusField(k)
	}
	res["ids"] = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	var rl unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NPROC, &rl)
	res["nproc"] = strconv.FormatUint(rl.Cur, 10)
	wd, _ := os.Getwd()
	res["cwd"] = wd
	var dev []string
	if ents, err := os.ReadDir("/dev"); err == nil {
		for _, e := range ents {
			dev = append(dev, e.Name())
		}
	}
	res["dev"] = strings.Join(dev, ",")
	if root := os.Getenv(envDoors); root != "" {
		_, err := os.ReadFile(root + "/drive/Users/me/secret.txt")
		res["door: read the drive"] = errName(err)
		res["door: interop socket"] = dialName(root + "/run-wsl/1_interop")
		res["door: mounted socket"] = dialName(root + "/docker.sock")
		res["door: $WSL_INTEROP"] = os.Getenv("WSL_INTEROP")
		res["door: $PATH"] = os.Getenv("PATH")
	}
	return res
}

// openDoors opens, under root, the doors a platform opens (the agent's
// mount namespace is the test's own): a writable "drive" (a tmpfs), an
// interop socket in run-wsl, a host socket mounted on docker.sock. It
// returns the workload environment a platform gives.
func openDoors(root string) ([]string, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, err
	}
	drive := root + "/drive"
	if err := unix.Mount("tmpfs", drive, "tmpfs", 0, "mode=0755"); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(drive+"/Users/me", 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(drive+"/Users/me/secret.txt", []byte("the user's files"), 0o644); err != nil {
		return nil, err
	}
	for _, sock := range []string{root + "/run-wsl/1_interop", root + "/host.sock"} {
		l, err := net.Listen("unix", sock)
		if err != nil {
			return nil, err
		}
		_ = os.Chmod(sock, 0o777)
		_ = l // served by the backlog until the agent exits
	}
	if err := os.WriteFile(root+"/docker.sock", nil, 0o644); err != nil {
		return nil, err
	}
	if err := unix.Mount(root+"/host.sock", root+"/docker.sock", "", unix.MS_BIND, ""); err != nil {
		return nil, err
	}
	return []string{"WSL_INTEROP=" + root + "/run-wsl/1_interop", "PATH=/usr/bin:/bin:" + drive + "/Windows/System32"}, nil
}

func dialName(path string) string {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return "connected"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

func statusField(name string) string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// workloadBinary copies this test binary where uid 1000 (and the ids a test
// user namespace maps it to) can execute it, and returns its path.
func workloadBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "oac-workload-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	bin := filepath.Join(dir, "workload.test")
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	return bin
}

// secretFile makes /…/home/runtime/secret, 0600, owned by uid.
func secretFile(t *testing.T, uid int) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "oac-secret-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "home"), 0o755))
	home := filepath.Join(dir, "home", "runtime")
	require.NoError(t, os.Mkdir(home, 0o700))
	require.NoError(t, os.Chown(home, uid, uid))
	secret := filepath.Join(home, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("SECRET"), 0o600))
	require.NoError(t, os.Chown(secret, uid, uid))
	return secret
}

func decodeScenario(t *testing.T, out []byte) scenario {
	t.Helper()
	var sc scenario
	require.NoError(t, json.Unmarshal(out, &sc), "%s", out)
	require.Empty(t, sc.Error)
	t.Logf("%+v", sc)
	return sc
}

// assertConfined checks the daemon reached nothing of oac-sandbox-io's.
func assertConfined(t *testing.T, sc scenario) {
	t.Helper()
	assert.True(t, sc.Isolated, sc.Why)
	assert.Empty(t, sc.Notes)
	a := sc.Attack
	assert.Equal(t, "EACCES", a["read secret"], "masked in the daemon's mount namespace")
	for _, k := range []string{"read secret via proc root", "open mem", "read environ", "list fd"} {
		assert.Equal(t, "EACCES", a[k], k)
	}
	assert.Equal(t, "EPERM", a["ptrace"])
	assert.Equal(t, "workload.test", a["target comm"], "the undumpable copy runs under the program's name")
	assert.Equal(t, "2", a["Seccomp"])
	assert.Equal(t, "1", a["NoNewPrivs"])
	assert.Equal(t, "1000:1000", a["ids"])
	assert.Equal(t, "/", a["cwd"])
	for _, k := range []string{"CapEff", "CapBnd", "CapAmb"} {
		assert.Equal(t, "0000000000000000", a[k], k)
	}
	assert.Equal(t, strconv.Itoa(PidsMax), a["nproc"])
	// /dev holds the contract's devices and nothing of the guest's own.
	for _, name := range strings.Split(a["dev"], ",") {
		assert.Contains(t, []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "mqueue", "fd", "stdin", "stdout", "stderr"}, name, "/dev/%s", name)
	}
	for _, name := range []string{"null", "zero", "urandom", "ptmx", "pts", "fd", "stdout"} {
		assert.Contains(t, strings.Split(a["dev"], ","), name)
	}

	// Without the launcher, the same uid reads the file, and still not
	// the neighbour's memory: that is the kernel's dumpable check, not
	// the filter.
	c := sc.Control
	assert.Equal(t, "ok", c["read secret"], "the mask, not the file's mode, kept the daemon out")
	assert.Equal(t, "0", c["Seccomp"])
	for _, k := range []string{"open mem", "read environ", "list fd", "read secret via proc root"} {
		assert.Equal(t, "EACCES", c[k], "%s: refused to an unfiltered process of the same uid", k)
	}
	assert.Equal(t, "EPERM", c["ptrace"])
}

func TestLaunchKeepsTheDaemonFromTheFileAndMemoryOfAnUndumpableNeighbour(t *testing.T) {
	needRoot(t)
	secret := secretFile(t, 1000)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=agent", envBin+"="+workloadBinary(t), envSecret+"="+secret)
	out, err := cmd.Output()
	require.NoError(t, err)
	assertConfined(t, decodeScenario(t, out))
	b, err := os.ReadFile(secret)
	require.NoError(t, err)
	assert.Equal(t, "SECRET", string(b), "the agent's view is untouched")
	assert.False(t, isMountPoint(t, secret), "nothing is mounted in the agent's namespace")
}

func TestLaunchClosesThePlatformsDoorsTheAgentFound(t *testing.T) {
	needRoot(t)
	secret := secretFile(t, 1000)
	root, err := os.MkdirTemp("", "oac-doors-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o755))
	for _, d := range []string{"drive", "run-wsl"} {
		require.NoError(t, os.Mkdir(filepath.Join(root, d), 0o755))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=agent", envBin+"="+workloadBinary(t), envSecret+"="+secret, envDoors+"="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	require.NoError(t, err)
	sc := decodeScenario(t, out)
	assertConfined(t, sc)
	a, c := sc.Attack, sc.Control
	// Without the launcher the same uid walks through every door.
	assert.Equal(t, "ok", c["door: read the drive"])
	assert.Equal(t, "connected", c["door: interop socket"])
	assert.Equal(t, "connected", c["door: mounted socket"])
	// Through it, none is there.
	assert.Equal(t, "ENOENT", a["door: read the drive"], "the drive's mount is detached")
	assert.Equal(t, "ENOENT", a["door: interop socket"], "the interop directory is covered")
	assert.Equal(t, "", a["door: $WSL_INTEROP"], "the interop socket's address is not passed")
	assert.Equal(t, "/usr/bin:/bin", a["door: $PATH"], "PATH loses the entries on the closed drive")
	assert.NotEqual(t, "connected", a["door: mounted socket"], "the socket mounted in is detached")
}

func TestLaunchUnderAnOCIRuntimesCapabilities(t *testing.T) {
	needRoot(t)
	// The "container": ids 0..65535 are host ids base.., as an OCI
	// runtime's user namespace maps them, and the OCI bundle's capabilities.
	const base = 3_000_000
	secret := secretFile(t, base+1000)
	bin := workloadBinary(t)
	setpriv, err := exec.LookPath("setpriv")
	require.NoError(t, err, "setpriv (util-linux) starts the agent with an OCI runtime's bounding set")
	cmd := exec.Command(setpriv, "--bounding-set", "-all,+kill,+setgid,+setuid,+setfcap", bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=agent", envBin+"="+bin, envSecret+"="+secret)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}},
		// As runc's: setgroups allowed, which nested namespaces inherit.
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
	}
	out, err := cmd.Output()
	require.NoError(t, err)
	sc := decodeScenario(t, out)
	assert.Equal(t, "00000000800000e0", sc.AgentCaps, "the agent holds CAP_KILL, CAP_SETGID, CAP_SETUID and CAP_SETFCAP only")
	assertConfined(t, sc)
	assert.False(t, isMountPoint(t, secret))
}

// dockerBounding is the docker provider's capabilities (guest root is
// host root: no user namespace of the runtime's) as setpriv names them.
const dockerBounding = "-all,+chown,+dac_override,+kill,+net_admin,+net_bind_service,+setgid,+setuid"

// asDockerAgent runs the agent's scenario as root of the host's user
// namespace holding only bounding's capabilities, as the docker
// provider's container does.
func asDockerAgent(t *testing.T, bounding, secret string) []byte {
	t.Helper()
	bin := workloadBinary(t)
	setpriv, err := exec.LookPath("setpriv")
	require.NoError(t, err, "setpriv (util-linux) starts the agent with a container's bounding set")
	cmd := exec.Command(setpriv, "--bounding-set", bounding, bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=agent", envBin+"="+bin, envSecret+"="+secret)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	require.NoError(t, err)
	return out
}

func TestLaunchUnderDockersCapabilities(t *testing.T) {
	needRoot(t)
	secret := secretFile(t, 1000)
	sc := decodeScenario(t, asDockerAgent(t, dockerBounding+",+setfcap", secret))
	assert.Equal(t, "00000000800014e3", sc.AgentCaps, "the docker provider's capabilities, SETFCAP included")
	assertConfined(t, sc)
	assert.False(t, isMountPoint(t, secret))
}

func TestTheDaemonIsRefusedWhereItCannotBeIsolated(t *testing.T) {
	needRoot(t)
	// Without CAP_SETFCAP (the docker provider before it added it) the
	// agent can make no namespace: oac-sandbox-io, with nothing to hide,
	// still starts; the daemon, which would read its private file, does
	// not.
	secret := secretFile(t, 1000)
	var sc scenario
	require.NoError(t, json.Unmarshal(asDockerAgent(t, dockerBounding, secret), &sc))
	t.Logf("%+v", sc)
	assert.False(t, sc.Isolated)
	assert.Contains(t, sc.Why, "CAP_SETFCAP")
	assert.Equal(t, "refused: this guest cannot give the process a mount namespace of its own: daemon would be able to read "+secret+
		" (oac-guest holds neither CAP_SYS_ADMIN nor CAP_SETUID, CAP_SETGID and CAP_SETFCAP (to map ids into a nested user namespace))", sc.Error)
	assert.Nil(t, sc.Attack, "the daemon never ran")
}

func TestALauncherRefusesToRunAProcessUnmasked(t *testing.T) {
	// The launcher's own check, should a spec ask for masks without a
	// namespace: it refuses before it changes anything.
	err := launch(Spec{Name: "daemon", Path: "/bin/true", Argv: []string{"true"}, Dir: "/", UID: 1000, GID: 1000, Mask: []string{"/home/runtime/secret"}}, io.Discard)
	require.ErrorIs(t, err, ErrNotIsolated)
	assert.EqualError(t, err, "refused: this guest cannot give the process a mount namespace of its own: daemon would be able to read /home/runtime/secret")
}

func TestALauncherThatCannotExecSaysWhyAndExits127(t *testing.T) {
	needRoot(t)
	c := detect(slog.New(slog.NewTextHandler(io.Discard, nil)), effectiveCaps())
	l, err := c.Command(Spec{Name: "daemon", Path: "/nonexistent/daemon", Argv: []string{"daemon"}, Dir: "/", UID: 1000, GID: 1000})
	require.NoError(t, err)
	require.NoError(t, l.Cmd.Start())
	l.Started()
	begin := time.Now()
	_, err = l.Finish()
	require.Error(t, err)
	assert.Equal(t, "exec /nonexistent/daemon: no such file or directory", err.Error())
	var ee *exec.ExitError
	require.ErrorAs(t, l.Cmd.Wait(), &ee)
	assert.Equal(t, 127, ee.ExitCode())
	t.Logf("launch to failure: %s", time.Since(begin))

	l, err = c.Command(Spec{Name: "daemon", Path: "/bin/true", Argv: []string{"true"}, Dir: "/nonexistent", UID: 1000, GID: 1000})
	require.NoError(t, err)
	require.NoError(t, l.Cmd.Start())
	l.Started()
	_, err = l.Finish()
	assert.EqualError(t, err, "chdir /nonexistent: no such file or directory")
	_ = l.Cmd.Wait()
}

func TestALauncherStartedByHandRefusesWithoutItsSpec(t *testing.T) {
	cmd := exec.Command(os.Args[0], LaunchArg)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), "started by oac-guest itself")
}

func isMountPoint(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func TestNoWorkloadStartsWithADoorOpenWhereTheGuestCannotCloseIt(t *testing.T) {
	c := &Confinement{iso: isoNone, why: "no namespace here"}
	c.SetDoors(doors.Plan{Detach: []string{"/mnt/c"}, Cover: []string{"/run/WSL"}})
	_, err := c.Command(Spec{Name: "oac-sandbox-io", Path: "/bin/true", Argv: []string{"true"}, Dir: "/"})
	require.ErrorIs(t, err, ErrDoorsOpen)
	assert.Contains(t, err.Error(), "oac-sandbox-io would reach /mnt/c, /run/WSL (no namespace here)")
	// The launcher's own check, should a spec carry doors without a
	// namespace.
	err = launch(Spec{Name: "daemon", Path: "/bin/true", Argv: []string{"true"}, Dir: "/", UID: 1000, GID: 1000, Doors: doors.Plan{Detach: []string{"/mnt/c"}}}, io.Discard)
	require.ErrorIs(t, err, ErrDoorsOpen)
}
