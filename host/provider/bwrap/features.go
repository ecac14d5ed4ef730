package bwrap

import (
	"bytes"
	"context"
	"os/exec"
	"sync"
	"time"
)

// SingleUIDCaps are the capabilities the agent keeps in a single-uid guest
// (ambient, in the guest's user namespace only): enough to give each
// workload process a mount namespace of its own and an empty bounding set
// (package guest/workload), nothing the agent could use outside.
var SingleUIDCaps = []string{"CAP_SYS_ADMIN", "CAP_SETPCAP"}

// features are what this bwrap binary supports beyond 0.4.
type features struct {
	// DisableUserns: bwrap 0.8 added --disable-userns (no user namespace
	// can be created inside the sandbox). It nests the sandbox in a user
	// namespace that maps only the sandbox's own uid, so it fits only the
	// single-uid mode: guest root and uid 1000 need two ids. In the other
	// modes the workload's seccomp filter refuses new user namespaces.
	DisableUserns bool
}

var featureCache sync.Map // bwrap path -> features

// bwrapFeatures asks the binary at path for its options (once per path).
func bwrapFeatures(path string) features {
	if f, ok := featureCache.Load(path); ok {
		return f.(features)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, path, "--help").Output()
	f := features{DisableUserns: bytes.Contains(out, []byte("--disable-userns"))}
	if len(out) > 0 {
		featureCache.Store(path, f)
	}
	return f
}
