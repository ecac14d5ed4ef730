package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// keptBench runs kept sandboxes of one provider under a keep root of its
// own: the first create and start of one, and the second start of
// another that has run once.
type keptBench struct {
	b    Bins
	root string
	prov []string
	// ran are sandboxes started once, for a second start.
	ran []string
}

func (k *keptBench) shim(args ...string) error {
	out, err := exec.Command(k.b.Shim, append(args, "--keep-root", k.root)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("oac-shim %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// start runs oac-shim start on name to ready and stops it.
func (k *keptBench) start(name string) (time.Duration, error) {
	s, err := startCommand(k.b, 60*time.Second, "start", name, "--keep-root", k.root)
	if err != nil {
		return 0, err
	}
	d := s.ready
	if err := s.stop(); err != nil {
		return 0, fmt.Errorf("stop: %w", err)
	}
	return d, nil
}

// first creates a sandbox and starts it to ready: the time of both.
func (k *keptBench) first() (float64, error) {
	name := benchName()
	t := time.Now()
	if err := k.shim(append([]string{"create", "--name", name, "--agent", k.b.Guest}, k.prov...)...); err != nil {
		return 0, err
	}
	created := time.Since(t)
	d, err := k.start(name)
	if err != nil {
		return 0, err
	}
	k.ran = append(k.ran, name)
	return ms(created + d), nil
}

// second starts a sandbox that ran once to ready (made untimed when
// none is waiting), then destroys it.
func (k *keptBench) second() (float64, error) {
	if len(k.ran) == 0 {
		if _, err := k.first(); err != nil {
			return 0, err
		}
	}
	name := k.ran[0]
	k.ran = k.ran[1:]
	d, err := k.start(name)
	if err != nil {
		return 0, err
	}
	if err := k.shim("destroy", "--name", name); err != nil {
		return 0, err
	}
	return ms(d), nil
}

// KeptFigures measures, per provider that keeps here, the second start of
// a kept sandbox to ready beside its first create and start.
func KeptFigures(r *Report, b Bins, runs int) error {
	provs := [][]string{{"--provider", "bwrap"}}
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.Skip("kept sandbox figure with oci "+rt, rt+" is not installed")
			continue
		}
		provs = append(provs, []string{"--provider", "oci", "--runtime", rt})
	}
	for _, p := range provs {
		root, err := os.MkdirTemp("", "oac-bench-keep-")
		if err != nil {
			return err
		}
		if err := os.Chmod(root, 0o711); err != nil {
			os.RemoveAll(root)
			return err
		}
		k := &keptBench{b: b, root: root, prov: p}
		base, subj, err := Pair(runs, k.first, k.second)
		for _, n := range k.ran {
			_ = k.shim("destroy", "--name", n)
		}
		os.RemoveAll(root)
		what := strings.Join(p[1:], " ")
		if err != nil {
			return fmt.Errorf("kept %s: %w", what, err)
		}
		res := NewResult(what+": second start of a kept sandbox to ready", "ms", subj, "its oac-shim create and first start to ready", base)
		r.Add(res.Judge("≤ 1x its first create and start", res.Ratio <= 1))
	}
	return nil
}
