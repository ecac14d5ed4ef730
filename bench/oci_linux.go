package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// bareRunc prepares an OCI bundle whose process is /bin/true on a
// read-only view of the host's /usr, and returns a function that runs it
// once with runtime and reports the time.
func bareRuntime(runtime, dir string) (func() (float64, error), error) {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr"), 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if t, err := os.Readlink("/" + l); err == nil {
			_ = os.Symlink(t, filepath.Join(rootfs, l))
		}
	}
	spec := exec.Command(runtime, "spec")
	spec.Dir = dir
	if out, err := spec.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s spec: %v: %s", runtime, err, out)
	}
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, err
	}
	proc := cfg["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	cfg["mounts"] = append(cfg["mounts"].([]any), map[string]any{
		"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"},
	})
	if b, err = json.Marshal(cfg); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	n := 0
	return func() (float64, error) {
		n++
		id := fmt.Sprintf("oac-bench-%d-%d", os.Getpid(), n)
		t := time.Now()
		out, err := runtimeCmd(runtime, "run", "--bundle", dir, id).CombinedOutput()
		d := ms(time.Since(t))
		_ = runtimeCmd(runtime, "delete", "--force", id).Run()
		if err != nil {
			return 0, fmt.Errorf("%s run: %v: %s", runtime, err, out)
		}
		return d, nil
	}, nil
}

// runtimeCmd runs an OCI runtime; crun refuses this machine's hybrid
// cgroup layout unless the cgroup2 mount is hidden in a private mount
// namespace (as the oci provider does).
func runtimeCmd(runtime string, args ...string) *exec.Cmd {
	if runtime != "crun" {
		return exec.Command(runtime, args...)
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err != nil {
		return exec.Command(runtime, args...)
	}
	return exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
		`umount -l /sys/fs/cgroup/unified && exec "$@"`, "sh", runtime}, args...)...)
}

// OCIFigures measures oac-shim with the oci provider to ready against the
// runtime running /bin/true, for each runtime installed.
func OCIFigures(r *Report, b Bins, runs int) error {
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.Skip("oci boot figure with "+rt, rt+" is not installed")
			continue
		}
		dir, err := os.MkdirTemp("", "oac-bench-oci-")
		if err != nil {
			return err
		}
		bare, err := bareRuntime(rt, dir)
		if err != nil {
			os.RemoveAll(dir)
			return err
		}
		base, subj, err := Pair(runs, bare, shimToReady(b, 30*time.Second, "--provider", "oci", "--runtime", rt))
		os.RemoveAll(dir)
		if err != nil {
			return fmt.Errorf("oci boot with %s: %w", rt, err)
		}
		r.Add(NewResult("oci ("+rt+"): oac-shim start to ready event", "ms", subj, rt+" running /bin/true", base))
	}
	return nil
}
