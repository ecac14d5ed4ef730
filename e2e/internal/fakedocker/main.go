//go:build linux

// Command fakedocker stands in for the docker client in the docker
// provider's end-to-end tests (no Docker engine runs on the build
// machines). It records every argv in $OAC_FAKE_DOCKER_STATE/argv.log and
// answers the commands the provider uses:
//
//	version --format {{.Server.Version}}     prints 24.0.7 ("noengine" mode: fails like a client without an engine)
//	info --format {{json .SecurityOptions}}  prints seccomp only (no userns-remap)
//	image inspect --format {{.Id}} IMAGE     ok ("noimage" mode: No such image)
//	run ... IMAGE ARGS...                    runs the --entrypoint from its bind mount source
//	                                         on the host, with /run/oac rewritten to the bound
//	                                         directory; the "container" outlives a killed client
//	kill NAME, rm --force NAME               kill the container's process
//
// It checks nothing of the isolation flags: their exact argv is asserted
// by the tests that read argv.log.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

var state = os.Getenv("OAC_FAKE_DOCKER_STATE")

func main() {
	if state == "" {
		fmt.Fprintln(os.Stderr, "OAC_FAKE_DOCKER_STATE is not set")
		os.Exit(2)
	}
	args := os.Args[1:]
	if f, err := os.OpenFile(filepath.Join(state, "argv.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
		b, _ := json.Marshal(args)
		f.Write(append(b, '\n'))
		f.Close()
	}
	mode := os.Getenv("OAC_FAKE_DOCKER_MODE")
	if len(args) == 0 {
		os.Exit(2)
	}
	switch args[0] {
	case "version":
		if mode == "noengine" {
			fmt.Println("Client: Docker Engine - Community\n Version:           24.0.7")
			fmt.Fprintln(os.Stderr, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")
			os.Exit(1)
		}
		fmt.Println("24.0.7")
	case "info":
		fmt.Println(`["name=seccomp,profile=builtin","name=cgroupns"]`)
	case "image":
		if mode == "noimage" {
			fmt.Fprintf(os.Stderr, "Error: No such image: %s\n", args[len(args)-1])
			os.Exit(1)
		}
		fmt.Println("sha256:0123456789abcdef")
	case "kill":
		if !killContainer(args[1]) {
			fmt.Fprintf(os.Stderr, "Error response from daemon: Cannot kill container: %s: No such container: %s\n", args[1], args[1])
			os.Exit(1)
		}
		fmt.Println(args[1])
	case "rm":
		name := args[len(args)-1]
		if !killContainer(name) {
			fmt.Fprintf(os.Stderr, "Error response from daemon: No such container: %s\n", name)
			os.Exit(1)
		}
		os.RemoveAll(filepath.Join(state, "containers", name))
		fmt.Println(name)
	case "run":
		os.Exit(run(args[1:]))
	default:
		fmt.Fprintf(os.Stderr, "fakedocker: unexpected arguments %q\n", args)
		os.Exit(2)
	}
}

// flagsWithValue are the run flags the provider passes that take a value.
var flagsWithValue = map[string]bool{
	"--name": true, "--label": true, "--pull": true, "--user": true, "--network": true, "--cap-drop": true,
	"--cap-add": true, "--security-opt": true, "--pids-limit": true, "--tmpfs": true, "--mount": true,
	"--hostname": true, "--entrypoint": true,
}

func run(args []string) int {
	var name, entrypoint string
	rm := false
	binds := map[string]string{} // dst -> src
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "--"); i++ {
		f := args[i]
		if f == "--rm" || f == "--read-only" {
			rm = rm || f == "--rm"
			continue
		}
		if !flagsWithValue[f] || i+1 >= len(args) {
			fmt.Fprintf(os.Stderr, "unknown flag: %s\n", f)
			return 125
		}
		v := args[i+1]
		i++
		switch f {
		case "--name":
			name = v
		case "--entrypoint":
			entrypoint = v
		case "--mount":
			var src, dst string
			for _, kv := range strings.Split(v, ",") {
				k, val, _ := strings.Cut(kv, "=")
				switch k {
				case "src":
					src = val
				case "dst":
					dst = val
				}
			}
			binds[dst] = src
		}
	}
	if i >= len(args) || name == "" || entrypoint == "" {
		fmt.Fprintln(os.Stderr, "docker: run needs --name, --entrypoint and an image")
		return 125
	}
	dir := filepath.Join(state, "containers", name)
	if _, err := os.Stat(dir); err == nil {
		fmt.Fprintf(os.Stderr, "docker: Error response from daemon: Conflict. The container name \"/%s\" is already in use by container \"0123\".\n", name)
		return 125
	}
	os.MkdirAll(dir, 0o700)
	host := func(p string) string {
		if src, ok := binds[p]; ok {
			return src
		}
		for dst, src := range binds {
			if rest, ok := strings.CutPrefix(p, dst+"/"); ok {
				return filepath.Join(src, rest)
			}
		}
		return p
	}
	var argv []string
	for _, a := range args[i+1:] {
		if rest, ok := strings.CutPrefix(a, "unix://"); ok {
			a = "unix://" + host(rest)
		}
		argv = append(argv, a)
	}
	cmd := exec.Command(host(entrypoint), argv...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "docker: Error response from daemon: failed to create task: exec: %v\n", err)
		os.RemoveAll(dir)
		return 127
	}
	os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	err := cmd.Wait()
	if rm {
		os.RemoveAll(dir)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 0
}

// killContainer kills the container's processes (the agent, a subreaper,
// and everything below it, which may run in sessions of their own), as an
// engine tearing down a container's pid namespace would; false when there
// is no such container.
func killContainer(name string) bool {
	dir := filepath.Join(state, "containers", name)
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		_, serr := os.Stat(dir)
		return serr == nil
	}
	if pid, err := strconv.Atoi(string(b)); err == nil && pid > 0 {
		// Only the process this fake started (a recycled pid is someone else's).
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "/sandboxes/"+strings.TrimPrefix(name, "oac-")+"/run/agent.sock") {
			for _, p := range descendants(pid) {
				_ = syscall.Kill(p, syscall.SIGSTOP) // no more forks while we kill
			}
			for _, p := range descendants(pid) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	return true
}

// descendants returns pid's descendants, deepest last, from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 {
			if pp, err := strconv.Atoi(f[1]); err == nil {
				children[pp] = append(children[pp], p)
			}
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
