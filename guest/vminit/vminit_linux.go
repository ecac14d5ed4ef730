package vminit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/guest/agent"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/workload"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// ModuleListPath lists the modules to load at boot, one absolute path per
// line, in load order; initramfs.ModuleListPath writes it.
const ModuleListPath = "/etc/oac/modules"

// CmdlinePath is where the kernel command line is read from.
const CmdlinePath = "/proc/cmdline"

// ReadParams reads the oac.* parameters of the running kernel. It returns
// an error wrapping ErrNotVM when oac.transport is absent.
func ReadParams() (Params, error) {
	b, err := os.ReadFile(CmdlinePath)
	if err != nil {
		return Params{}, fmt.Errorf("read kernel command line: %w", err)
	}
	return ParseParams(string(b))
}

// Boot runs oac-guest as PID 1 of a VM and never returns. It expects the
// caller to have mounted what initsys.Mounts lists and brought lo up. It
// loads the modules listed in ModuleListPath, switches into the image's
// root disk when p.Root names one (SwitchRoot), mounts the virtio-fs
// shares, mounts cgroup2, finds the transport, then runs agent sessions: each Welcome sets the clock; a
// Shutdown (or ctx ending) powers the VM off; a lost host connection is
// retried until p.HostGrace has passed without one, then the VM powers
// off. A fatal error is logged on the console (stderr) and powers off too.
func Boot(ctx context.Context, p Params, cfg agent.Config) {
	log := cfg.Log
	if err := loadModules(log); err != nil {
		Fatal(log, err)
	}
	if p.Root != "" {
		keep := map[string]bool{}
		for _, s := range p.Shares {
			keep[s.Path] = true
		}
		if err := SwitchRoot(ctx, log, p.Root, p.Keep, keep); err != nil {
			Fatal(log, err)
		}
	} else if p.Keep != "" {
		keep := map[string]bool{}
		for _, s := range p.Shares {
			keep[s.Path] = true
		}
		if err := KeepInitramfs(ctx, log, p.Keep, keep); err != nil {
			Fatal(log, err)
		}
	}
	if err := MountShares(log, p.Shares); err != nil {
		Fatal(log, err)
	}
	if res, _ := initsys.EnsureMounts([]initsys.Mount{initsys.CgroupMount}); len(res) > 0 && res[0].Err != nil {
		log.Warn("cgroup2 unavailable", "err", res[0].Err)
	}
	for _, s := range p.Shares {
		cfg.Shares = append(cfg.Shares, s.Path)
	}
	// Once per boot (it creates the workload's cgroup), not per session.
	if cfg.Confinement == nil {
		cfg.Confinement = workload.Prepare(log)
	}
	ep, err := endpoint(ctx, p)
	if err != nil {
		Fatal(log, err)
	}
	log.Info("transport", "endpoint", ep.String(), "host_grace", p.HostGrace.String())
	sv := supervisor{
		grace: p.HostGrace,
		log:   log,
		session: func(ctx context.Context, connected func()) error {
			c := cfg
			c.Endpoint = ep
			c.OnWelcome = func(w protocol.Welcome) {
				setClock(log, w.TimeUnixNano)
				connected()
			}
			c.OnTime = func(t protocol.Time) { setClock(log, t.TimeUnixNano) }
			// The host keeps the clock in step after that (its sleeps
			// stop the VM's clock): reads, steps, jump reports.
			c.SetClock = agent.SetRealtime
			return agent.Run(ctx, c)
		},
	}
	powerOff(log, sv.run(ctx))
}

// loadModules loads every module of ModuleListPath in order; an image
// without the file loads none.
func loadModules(log *slog.Logger) error {
	f, err := os.Open(ModuleListPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open module list: %w", err)
	}
	mods, err := initsys.ReadModuleList(f)
	f.Close()
	if err != nil {
		return err
	}
	start := time.Now()
	for _, m := range mods {
		if err := initsys.LoadModule(m); err != nil {
			return err
		}
	}
	log.Info("modules loaded", "count", len(mods), "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// endpoint turns the transport parameter into an endpoint, waiting up to
// the host grace for a virtio-serial port to appear.
func endpoint(ctx context.Context, p Params) (transport.Endpoint, error) {
	if p.Transport.Vsock != nil {
		return *p.Transport.Vsock, nil
	}
	wctx, cancel := context.WithTimeout(ctx, p.HostGrace)
	defer cancel()
	dev, err := WaitVirtioPort(wctx, "/sys", "/dev", p.Transport.SerialName)
	if err != nil {
		return transport.Endpoint{}, fmt.Errorf("find transport %s: %w", p.Transport, err)
	}
	return transport.Endpoint{Scheme: transport.SchemeSerial, Path: dev}, nil
}

// clockSlack is the difference between the host's clock and ours below
// which the clock is left alone.
const clockSlack = 10 * time.Millisecond

func setClock(log *slog.Logger, unixNano int64) {
	if unixNano <= 0 {
		return
	}
	host := time.Unix(0, unixNano)
	delta := host.Sub(time.Now())
	if delta.Abs() < clockSlack {
		return
	}
	if err := initsys.SetClock(host); err != nil {
		log.Warn("clock", "err", err)
		return
	}
	log.Info("clock set from the host", "delta", delta.Round(time.Millisecond).String())
}

// Fatal logs err on the console and powers the VM off; it never returns.
func Fatal(log *slog.Logger, err error) {
	log.Error("fatal", "err", err)
	powerOff(log, "fatal error: "+err.Error())
}

// powerOff never returns: PID 1 exiting would panic the kernel.
func powerOff(log *slog.Logger, reason string) {
	log.Info("powering off", "reason", reason)
	if err := initsys.PowerOff(); err != nil {
		log.Error("cannot power off; halting here", "err", err)
	}
	select {}
}

// supervisor runs agent sessions and decides when the VM powers off.
type supervisor struct {
	grace time.Duration
	log   *slog.Logger
	// session runs one agent session; it calls connected once the host
	// accepted it and returns nil after an orderly stop.
	session func(ctx context.Context, connected func()) error
}

// run returns why the VM should power off: the host asked it to, or no
// host connection existed for the grace (counted from boot and from each
// loss of the connection).
func (s supervisor) run(ctx context.Context) string {
	deadline := time.Now().Add(s.grace)
	const maxBackoff = time.Second
	backoff := 50 * time.Millisecond
	for {
		connected := make(chan struct{})
		var once sync.Once
		errc := make(chan error, 1)
		sctx, cancel := context.WithCancel(ctx)
		go func() { errc <- s.session(sctx, func() { once.Do(func() { close(connected) }) }) }()
		timer := time.NewTimer(time.Until(deadline))
		var err error
		select {
		case <-connected:
			timer.Stop()
			err = <-errc
		case err = <-errc:
			timer.Stop()
		case <-timer.C:
			cancel()
			return fmt.Sprintf("no host connection for %s", s.grace)
		}
		cancel()
		if ctx.Err() != nil {
			return "stop signal"
		}
		if err == nil {
			return "the host asked the guest to stop"
		}
		select {
		case <-connected:
			deadline = time.Now().Add(s.grace)
			backoff = 50 * time.Millisecond
			s.log.Warn("host connection gone; waiting for it to come back", "err", err, "grace", s.grace.String())
		default:
			s.log.Info("no session with the host yet", "err", err)
		}
		select {
		case <-time.After(min(backoff, time.Until(deadline))):
		case <-ctx.Done():
			return "stop signal"
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
