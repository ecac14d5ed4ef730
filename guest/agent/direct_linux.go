package agent

import (
	"os"

	"github.com/oac/sandbox-agent/guest/direct"
	"github.com/oac/sandbox-agent/protocol"
)

// startDirect turns direct mode on (docs/egress.md, "Direct mode") when
// the host offered it and the capture runs: a connect the host cannot
// take then goes on to the capture, the handed path. Every workload
// process started from now on traps its connects to a supervisor of its
// listener. It returns what the host is told in a starting event.
func (a *agent) startDirect() string {
	if !protocol.HasCapability(a.welcome.Capabilities, protocol.CapDataDirect) {
		return ""
	}
	if a.transparent == nil || a.exit == nil {
		return "direct mode unavailable: it needs the capture, which is not running here; connections take the proxies"
	}
	if err := direct.Probe(); err != nil {
		return "direct mode unavailable: its guarantees do not hold in this guest (" + err.Error() + "); connections take the handed path"
	}
	var cookie uint64
	if err := a.wl.get().Do(func() (err error) { cookie, err = direct.NetnsCookie(); return err }); err != nil {
		return "direct mode unavailable: cannot tell the workload's sockets from the host's (" + err.Error() + "); connections take the handed path"
	}
	a.direct = direct.New(a.directCtx, direct.Config{Ask: a.exit.Direct, Log: a.cfg.Log, Netns: cookie})
	a.cfg.Confinement.SetDirect(true)
	return "direct mode: the workload's connects are answered with the host's own sockets (no relay); a process the kernel cannot trap takes the handed path"
}

// superviseDirect serves the listener of a process started in direct
// mode until every process under it is gone.
func (a *agent) superviseDirect(name string, l *os.File) {
	if l == nil {
		return
	}
	if a.direct == nil {
		l.Close() // never asked for: its calls fail with ENOSYS
		return
	}
	a.cfg.Log.Info("direct mode: trapping connects", "process", name)
	go a.direct.Serve(l)
}
