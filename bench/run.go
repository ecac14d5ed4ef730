//go:build linux

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Options configure a run.
type Options struct {
	Bin, Out      string
	Runs, Density int
	// Only, when not empty, names the groups to run (mux, egress,
	// transparent, clients, boot, footprint, density, oci, hosted, qemu, kept, kubernetes, peer, warm); results
	// are then printed but not written, unless Merge.
	Only []string
	// Merge, with Only, replaces those groups' rows in the report in Out
	// and keeps the others (groups that tag their rows only: kubernetes, peer, warm).
	Merge bool
}

func (o Options) want(group string) bool {
	if len(o.Only) == 0 {
		return true
	}
	for _, g := range o.Only {
		if strings.TrimSpace(g) == group {
			return true
		}
	}
	return false
}

// Run measures every figure this host can and writes the report. A figure
// that needs something this host lacks is listed as not measured, with why.
func Run(o Options) error {
	if o.Merge {
		for _, g := range o.Only {
			if g := strings.TrimSpace(g); g != KubeGroup && g != PeerGroup && g != WarmGroup {
				return fmt.Errorf("-merge: group %q does not tag its rows (only %s, %s and %s do)", g, KubeGroup, PeerGroup, WarmGroup)
			}
		}
		if len(o.Only) == 0 {
			return fmt.Errorf("-merge needs -only")
		}
	}
	r := NewReport()
	root := os.Geteuid() == 0
	if o.want("mux") {
		if err := MuxFigures(r, o.Runs); err != nil {
			return err
		}
	}
	if o.want("egress") {
		if err := EgressFigures(r, o.Runs, 256<<20, 200); err != nil {
			return err
		}
	}
	if o.want("transparent") {
		if !root {
			r.Skip("transparent egress figures", "need root (a network namespace with nftables)")
		} else if err := TransparentFigures(r, o.Runs, 256<<20, 200); err != nil {
			return err
		}
	}
	b, err := FindBins(o.Bin)
	if err != nil {
		return err
	}
	_, errB := exec.LookPath("bwrap")
	switch {
	case !o.want("boot") && !o.want("footprint") && !o.want("density"):
	case errB != nil || !root:
		r.Skip("bwrap figures", "need bubblewrap and root")
	default:
		if o.want("boot") {
			if err := BootFigures(r, b, o.Runs); err != nil {
				return err
			}
		}
		if o.want("footprint") {
			if err := FootprintFigures(r, b, min(o.Runs, 5)); err != nil {
				return err
			}
		}
		if o.want("density") {
			if err := DensityFigures(r, b, o.Density); err != nil {
				return err
			}
		}
	}
	if o.want("clients") {
		switch {
		case !root:
			r.Skip("real clients in guests", "need root (bwrap with an id range, OCI, qemu)")
		case errB != nil:
			r.Skip("real clients in guests", "need bubblewrap")
		default:
			if err := ClientFigures(r, b, o.Runs, 256<<20, envOr("OAC_KERNEL_CACHE", ".cache/kernel")); err != nil {
				return err
			}
		}
	}
	if o.want(PeerGroup) {
		r.group = PeerGroup
		switch {
		case !root:
			r.Skip(PeerGroup+": sandbox-runtime "+SRTVersion, "need root (oac's bwrap guest with an id range)")
		case errB != nil:
			r.Skip(PeerGroup+": sandbox-runtime "+SRTVersion, "need bubblewrap")
		default:
			if err := PeerFigures(r, b, o.Runs, 256<<20, envOr("OAC_BENCH_CACHE", ".cache")); err != nil {
				return err
			}
		}
		r.group = ""
	}
	if o.want("oci") {
		if !root {
			r.Skip("oci boot figures", "need root")
		} else if err := OCIFigures(r, b, o.Runs); err != nil {
			return err
		}
	}
	if o.want("kept") {
		switch {
		case !root:
			r.Skip("kept sandbox figures", "need root (bwrap with an id range, OCI, docker, qemu)")
		case errB != nil:
			r.Skip("kept sandbox figures", "need bubblewrap")
		default:
			if err := KeptFigures(r, b, min(o.Runs, 11), VMArch{Arch: "amd64", KernelCache: envOr("OAC_KERNEL_CACHE", ".cache/kernel")}); err != nil {
				return err
			}
		}
	}
	if o.want("hosted") {
		if !root {
			r.Skip("hosted boot figures", "need root")
		} else if err := HostedFigures(r, b, min(o.Runs, 11)); err != nil {
			return err
		}
	}
	if o.want(WarmGroup) {
		r.group = WarmGroup
		if !root {
			r.Skip(WarmGroup+" sandbox figures", "need root (bwrap, OCI, docker)")
		} else if err := WarmFigures(r, b, min(o.Runs, 11), VMArch{Arch: "amd64", KernelCache: envOr("OAC_KERNEL_CACHE", ".cache/kernel")}); err != nil {
			return err
		}
		r.group = ""
	}
	if o.want("qemu") {
		if !root {
			r.Skip("qemu boot figures", "need root (the image's disk is written with owners 0 and 1000)")
		} else if err := QemuFigures(r, b, []VMArch{
			{Arch: "amd64", KernelCache: envOr("OAC_KERNEL_CACHE", ".cache/kernel")},
			{Arch: "arm64", KernelCache: envOr("OAC_KERNEL_CACHE_ARM64", ".cache/kernel-arm64")},
		}, min(o.Runs, 5)); err != nil {
			return err
		}
	}
	if o.want(KubeGroup) {
		r.group = KubeGroup
		if !root {
			r.Skip("kubernetes figures", "need root (the test cluster runs containerd and a kubelet)")
		} else if err := KubernetesFigures(r, b, min(o.Runs, 11)); err != nil {
			return err
		}
		r.group = ""
	}
	if len(o.Only) > 0 {
		if !o.Merge {
			return nil
		}
		if err := r.Merge(o.Out, o.Only); err != nil {
			return fmt.Errorf("merge results: %w", err)
		}
		fmt.Printf("merged into %s/results.md and %s/results.json\n", o.Out, o.Out)
		return nil
	}
	if err := r.Write(o.Out); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	fmt.Printf("wrote %s/results.md and %s/results.json\n", o.Out, o.Out)
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// sharedTempDir makes a temporary directory others may read and search
// (a guest's ids are not this process's), and its removal.
func sharedTempDir(prefix string) (string, func(), error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}
