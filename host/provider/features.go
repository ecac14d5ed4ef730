package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Feature is an optional part of a Spec, named by the oac-shim flag that
// asks for it. A provider honours it or the sandbox refuses it before
// anything is created: nothing a caller asks for is silently ignored.
type Feature string

// Features a Spec may ask for.
const (
	// FeatureRootfs: Spec.Rootfs, a root other than the provider's
	// default.
	FeatureRootfs Feature = "--rootfs"
	// FeatureSandboxIO: Spec.SandboxIOPath installed as
	// /usr/local/bin/oac-sandbox-io.
	FeatureSandboxIO Feature = "--sandbox-io"
	// FeatureInstall: Spec.Install, host binaries in /usr/local/bin.
	FeatureInstall Feature = "--install"
	// FeatureVolume: Spec.Volumes, host directories as /home or
	// /environment.
	FeatureVolume Feature = "--volume"
)

// AllFeatures lists every Feature in the order refusals are checked.
var AllFeatures = []Feature{FeatureRootfs, FeatureSandboxIO, FeatureInstall, FeatureVolume}

// ErrUnsupported wraps a refusal of a Feature the provider does not
// honour; it is an ErrInvalidSpec too.
var ErrUnsupported = errors.New("not supported by this provider")

// Features returns the optional features s asks for.
func (s Spec) Features() []Feature {
	var out []Feature
	if s.Rootfs != "" {
		out = append(out, FeatureRootfs)
	}
	if s.SandboxIOPath != "" {
		out = append(out, FeatureSandboxIO)
	}
	if len(s.Install) > 0 {
		out = append(out, FeatureInstall)
	}
	if len(s.Volumes) > 0 {
		out = append(out, FeatureVolume)
	}
	return out
}

// Capabilities are a provider's fixed facts, read wherever a decision
// depends on what a provider can do (the create checks, the kept service,
// oac-shim check and run): what a provider can do is data, one value per
// provider; interfaces are for behaviour only (Keeper's Discard,
// Detailer, Resetter, ImageNamer, Confiner).
type Capabilities struct {
	// Honours lists the optional features the provider carries into its
	// guests; the sandbox refuses the others before anything is made.
	Honours []Feature
	// Instead says, for a feature it does not honour, what to do instead
	// (missing: the generic advice).
	Instead map[Feature]string
	// Keeps: the provider keeps a sandbox across runs (Spec.Keep); it
	// must implement Keeper, whose Discard removes what it kept.
	Keeps bool
	// Warnings are what its settings give up, told before a sandbox runs.
	Warnings []string
	// OwnClock: the guest runs a kernel of its own (a VM) whose clock
	// stops while the host sleeps; the shim keeps it in step with the
	// host's (docs/vm.md). A guest sharing the host's kernel shares its
	// clock, and the shim never reads or sets it.
	OwnClock bool
	// GuestRootUnprivileged: the guest's root holds no capability in the
	// host's user namespace (a user namespace maps it to an unprivileged
	// host id, or it runs a kernel of its own). Only such a provider is
	// offered direct mode, which hands the guest sockets of the host's
	// network namespace: a guest root with the host's CAP_NET_ADMIN (a
	// container without a user namespace) could change the host's routes
	// through one, or take the namespace itself (docs/threat-model.md).
	GuestRootUnprivileged bool
	// ClaimVolumes: a warm sandbox's claim can bring volumes (docs/warm.md):
	// the guest's agent is a process of this kernel, connected over a unix
	// socket, whose /home and /environment are mount points of its own, and
	// the shim may enter its mount namespace (root) to move a host
	// directory onto them (host/volmount).
	ClaimVolumes bool
}

// Honours returns the features p honours.
func Honours(p Provider) []Feature { return p.Capabilities().Honours }

// Refuse returns nil when p honours every feature spec asks for, else an
// error wrapping ErrInvalidSpec and ErrUnsupported that names the first
// flag p would ignore, the provider, and what to do instead. The sandbox
// calls it before anything is created.
func Refuse(p Provider, spec Spec) error {
	caps := p.Capabilities()
	for _, f := range spec.Features() {
		if slices.Contains(caps.Honours, f) {
			continue
		}
		instead := caps.Instead[f]
		if instead == "" {
			instead = defaultInstead[f]
		}
		return fmt.Errorf("%w: %s: %w: the %s provider does not honour %s; %s", ErrInvalidSpec, f, ErrUnsupported, p.Name(), f, instead)
	}
	return nil
}

var defaultInstead = map[Feature]string{
	FeatureRootfs:    "it boots its own image (see its flags)",
	FeatureSandboxIO: "put oac-sandbox-io into the guest image instead (oac-image build --sandbox-io)",
	FeatureInstall:   "put the binary into the guest image instead (oac-image build --file)",
	FeatureVolume:    "it has no persistent volumes: the guest's /home and /environment come from its image",
}

// CheckClaimVolumes checks a claim's volumes (guest directory to host
// directory) for p: each names /home or /environment and an absolute
// existing host directory, and p takes volumes at claim. Errors wrap
// ErrInvalidSpec, and ErrUnsupported when p cannot.
func CheckClaimVolumes(p Provider, vols map[string]string) error {
	if len(vols) == 0 {
		return nil
	}
	if !p.Capabilities().ClaimVolumes {
		return fmt.Errorf("%w: %w: the %s provider cannot mount volumes into a warm sandbox at its claim (a root shim on bwrap, runc or crun can); boot the sandbox with --volume instead of from a warm pool", ErrInvalidSpec, ErrUnsupported, p.Name())
	}
	for dir, host := range vols {
		if !slices.Contains(VolumeDirs, dir) {
			return fmt.Errorf("%w: volume %q: a volume can replace only /home or /environment", ErrInvalidSpec, dir)
		}
		if !filepath.IsAbs(host) {
			return fmt.Errorf("%w: volume %s: the host directory %q is not an absolute path", ErrInvalidSpec, dir, host)
		}
		st, err := os.Stat(host)
		if err != nil {
			return fmt.Errorf("%w: volume %s: %v", ErrInvalidSpec, dir, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("%w: volume %s: %s is not a directory", ErrInvalidSpec, dir, host)
		}
	}
	return nil
}

// CheckSpec is what every create checks before anything is made (a
// sandbox's attempt and a kept sandbox's create or reset alike): a kept
// spec needs a Keeper, the spec's own rules hold, and p honours every
// feature it asks for. Errors wrap ErrInvalidSpec.
func CheckSpec(p Provider, spec Spec) error {
	if spec.Keep != nil {
		if !p.Capabilities().Keeps {
			return fmt.Errorf("%w: the %s provider cannot keep a sandbox", ErrInvalidSpec, p.Name())
		}
		if _, ok := p.(Keeper); !ok {
			return fmt.Errorf("the %s provider declares it keeps sandboxes but cannot discard them: a defect, report it", p.Name())
		}
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	return Refuse(p, spec)
}
