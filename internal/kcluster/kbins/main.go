//go:build linux

// Command kbins builds the test cluster's binaries into their cache once
// (internal/kcluster.EnsureBinaries, EnsureAgentSandbox and
// EnsureNetworkPolicy); `make
// k8s-bins` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/oac/sandbox-agent/internal/kcluster"
)

func main() {
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "kbins: "+format+"\n", a...) }
	t0 := time.Now()
	dir, err := kcluster.EnsureBinaries(context.Background(), kcluster.Options{Log: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbins:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kbins: %s %v in %s (%s)\n", kcluster.Version, kcluster.Binaries, dir, time.Since(t0).Round(time.Second))
	t0 = time.Now()
	dir, err = kcluster.EnsureAgentSandbox(context.Background(), kcluster.AgentSandboxOptions{Log: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbins:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kbins: agent-sandbox %s %s in %s (%s)\n", kcluster.AgentSandboxVersion, kcluster.AgentSandboxController, dir, time.Since(t0).Round(time.Second))
	t0 = time.Now()
	dir, err = kcluster.EnsureNetworkPolicy(context.Background(), kcluster.NetworkPolicyOptions{Log: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbins:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kbins: NetworkPolicy enforcer %s %s in %s (%s)\n", kcluster.NetworkPolicyVersion, kcluster.NetworkPolicyController, dir, time.Since(t0).Round(time.Second))
}
