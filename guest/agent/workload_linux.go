package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/oac/sandbox-agent/guest/netns"
	"github.com/oac/sandbox-agent/protocol"
)

// workloadNet is the network namespace the workload runs in: the agent's
// own (nil) until the bootstrap is applied, and after it when the guest's
// namespace has only lo.
type workloadNet struct{ ns atomic.Pointer[netns.NS] }

func (w *workloadNet) get() *netns.NS { return w.ns.Load() }

// dialLoopback is the forwardDialer of a session: the workload's
// loopback.
func (w *workloadNet) dialLoopback(ctx context.Context, port int) (c net.Conn, err error) {
	err = w.get().Do(func() (err error) {
		c, err = dialLoopback(ctx, port)
		return err
	})
	return c, err
}

func (w *workloadNet) close() { _ = w.get().Close() }

// isolate gives the workload a network namespace of its own with only lo
// when the guest's has any other interface; the workload must never see
// one. Without the privilege to make it, the bootstrap fails. (A bootstrap
// without a workload needs none: forwards then reach the agent's own
// loopback.)
func (a *agent) isolate() error {
	others, err := netns.Others()
	if err != nil {
		return err
	}
	if len(others) == 0 && !a.cfg.OwnNetNS {
		return nil
	}
	why := "the guest's has " + strings.Join(others, ", ")
	if len(others) == 0 {
		why = "always, in helper mode"
	}
	ns, err := netns.New()
	if err != nil {
		return fmt.Errorf("the workload must see only lo in a network namespace of its own (%s), and cannot get one: %w", why, err)
	}
	a.wl.ns.Store(ns)
	msg := "workload network: a namespace of its own with only lo (" + why + ")"
	a.cfg.Log.Info(msg)
	return a.state(protocol.State{State: protocol.StateStarting, Message: msg})
}
