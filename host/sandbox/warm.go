package sandbox

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/volmount"
	"github.com/oac/sandbox-agent/internal/crashpoint"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// waitClaim holds a warm sandbox after its handshake until a claim it can
// take arrives, and returns that claim's bootstrap (checked, with its
// password handed out, the Link allowed). It returns nil and no error
// when the sandbox stopped instead (ctx ended, or it was warm for its
// maximum age: a stopped state says which), and the reason when the
// guest failed or misbehaved while warm. A warm guest waits for its
// bootstrap and says nothing on the control stream but clock reports; any
// other message is a guest that does not follow the protocol, as is a
// guest that ends or breaks a bound. A refused claim leaves the sandbox
// warm: nothing of it reached the guest.
func (s *run) waitClaim(ctx context.Context) (*bootstrap.Bootstrap, error) {
	w := s.cfg.Warm
	msg := "warm: the guest is booted and connected, and waits for a claim"
	if w.MaxAge > 0 {
		msg += fmt.Sprintf(" (at most %s)", w.MaxAge)
	}
	s.setState(api.StateWarm, msg)
	crashpoint.Hit(crashpoint.WarmWaiting)
	var expired <-chan struct{}
	if w.MaxAge > 0 {
		ageCtx, cancel := context.WithTimeout(context.Background(), w.MaxAge)
		defer cancel()
		expired = ageCtx.Done()
	}
	for {
		// A stop wins over a claim or an expiry due at the same time.
		if ctx.Err() != nil {
			return nil, s.stopWarm(stopReason(ctx))
		}
		select {
		case <-ctx.Done():
			return nil, s.stopWarm(stopReason(ctx))
		case <-expired:
			why := fmt.Sprintf("warm for its maximum age (%s) and never claimed", w.MaxAge)
			s.emit(api.Event{Event: api.KindWarmExpired, Message: why})
			return nil, s.stopWarm(why)
		case <-s.guard.Violated():
			return nil, s.guardErr()
		case err := <-s.dataViolation:
			return nil, failure.With(failure.ErrHostileGuest, err)
		case <-s.inst.Done():
			if err := s.guardErr(); err != nil {
				return nil, err
			}
			s.guestDone = true
			return nil, failure.With(failure.ErrRuntimeFailed, s.withDiag(fmt.Errorf("the warm guest ended: %w", s.inst.Err())))
		case err := <-s.recvErr:
			if gerr := s.guardErr(); gerr != nil {
				return nil, gerr
			}
			s.guestDone = true
			if isViolation(err) {
				return nil, failure.With(failure.ErrHostileGuest, fmt.Errorf("the warm guest broke the protocol on the control stream: %w", err))
			}
			return nil, failure.With(failure.ErrRuntimeFailed, s.withDiag(fmt.Errorf("warm guest connection lost: %w", err)))
		case f := <-s.frames:
			switch f.Type {
			case protocol.TypeClock:
				if err := s.clockFrame(f); err != nil {
					return nil, err
				}
			default:
				return nil, failure.With(failure.ErrHostileGuest, fmt.Errorf("the warm guest sent %s before its bootstrap: a warm guest says nothing until it is claimed", f.Type))
			}
		case c := <-w.Claims:
			if err := c.Bootstrap.Validate(); err != nil {
				c.Taken <- fmt.Errorf("invalid bootstrap: %w", err)
				continue
			}
			vols, err := s.attachVolumes(c.Volumes)
			if err != nil {
				c.Taken <- err
				continue
			}
			crashpoint.Hit(crashpoint.ClaimMounted)
			b, err := s.takeBootstrap(c.Bootstrap)
			if err != nil {
				if derr := vols.Detach(); derr != nil {
					// The guest keeps a tenant's directory it was not
					// claimed with: it cannot stay warm for another.
					return nil, failure.With(failure.ErrRuntimeFailed, fmt.Errorf("a refused claim's volumes could not be taken back: %w", derr))
				}
				c.Taken <- err
				continue
			}
			s.allowLink(b)
			c.Taken <- nil
			return b, nil
		}
	}
}

// stopWarm stops a warm sandbox in order; the stopped state says why.
func (s *run) stopWarm(reason string) error {
	s.shutdown(reason)
	if err := s.guardErr(); err != nil {
		return err
	}
	s.setState(api.StateStopped, "stopped while warm: "+reason)
	return nil
}

// attachVolumes mounts a claim's volumes into the warm guest, all or none.
func (s *run) attachVolumes(vols []volmount.Volume) (*volmount.Attached, error) {
	if len(vols) == 0 {
		return nil, nil
	}
	a, err := volmount.Attach(s.transport, vols)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w (nothing was mounted; the sandbox stays warm)", err)
	}
	return a, nil
}
