package shimcli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/forward"
	"github.com/oac/sandbox-agent/host/lifecycle"
	"github.com/oac/sandbox-agent/host/sandbox"
)

// Handle carries out one control command (api.Handler); a refusal or a
// failure carries its answer code (api.AnswerCodes).
func (s *shim) Handle(ctx context.Context, c api.Command) (any, error) {
	res, err := s.handle(ctx, c)
	if err != nil {
		return nil, answerError(err)
	}
	return res, nil
}

// errStopping: the shim is stopping and starts nothing more.
var errStopping = errors.New("the shim is stopping")

// answerCodes maps the errors of the packages a command reaches to
// answer codes, first match wins; an error with a code already keeps it.
var answerCodes = []struct {
	kind error
	code string
}{
	{errStopping, api.AnswerStopping},
	{lifecycle.ErrDestroyed, api.AnswerStopping},
	{forward.ErrClosed, api.AnswerStopping},
	{forward.ErrExists, api.AnswerConflict},
	{forward.ErrNotFound, api.AnswerNotFound},
	{forward.ErrTooMany, api.AnswerLimitReached},
	{errNoGuest, api.AnswerNotReady},
	{sandbox.ErrNotSupported, api.AnswerUnsupported},
}

func answerError(err error) error {
	if ce := (*api.CommandError)(nil); errors.As(err, &ce) {
		return err
	}
	for _, r := range answerCodes {
		if errors.Is(err, r.kind) {
			return api.Refuse(r.code, err)
		}
	}
	return api.Refuse(api.AnswerFailed, err)
}

func (s *shim) handle(ctx context.Context, c api.Command) (any, error) {
	switch c.Cmd {
	case api.CmdStatus:
		return s.status(), nil
	case api.CmdStop:
		s.requestStop(errors.New("stop command"))
		return s.status(), nil
	case api.CmdStart:
		if s.stopping() {
			return nil, errStopping
		}
		a, err := s.ctrl.Start()
		if err != nil {
			return nil, err
		}
		return api.StartResult{Attempt: a}, nil
	case api.CmdReset:
		if s.stopping() {
			return nil, errStopping
		}
		// A reset is a fresh start (with a new password unless the
		// caller made it: --password-stdin, the bootstrap's), which first
		// removes what the provider left of the sandbox and, for a kept
		// sandbox (oac-shim start), everything it kept (resetFirst).
		// Volumes are the caller's and stay.
		s.mu.Lock()
		defer s.mu.Unlock()
		a, err := s.ctrl.Start()
		if err != nil {
			return nil, err
		}
		s.resets[a] = true
		return api.StartResult{Attempt: a}, nil
	case api.CmdSetPolicy:
		pol, err := egress.ParsePolicy(c.Allow, c.Upstreams)
		if err != nil {
			s.policyEvent("policy replacement refused, previous policy kept (" + err.Error() + ")")
			return nil, api.Refuse(api.AnswerInvalidArgument, err)
		}
		s.broker.SetPolicy(pol)
		s.policyEvent("egress policy replaced by a control command")
		return api.PolicyResult{Egress: nonNil(pol.Describe())}, nil
	case api.CmdAddForward:
		sp := forward.Spec{Listen: c.Listen, GuestPort: c.GuestPort}
		if err := sp.Validate(); err != nil {
			return nil, api.Refuse(api.AnswerInvalidArgument, err)
		}
		info, err := s.fwd.Add(sp)
		if err != nil {
			return nil, err
		}
		r := api.ForwardResult{ForwardInfo: info}
		if !sp.IsUnix() {
			r.URL = "http://" + info.Listen
		}
		return r, nil
	case api.CmdRemoveForward:
		if err := s.fwd.Remove(c.Listen); err != nil {
			return nil, err
		}
		return struct{}{}, nil
	case api.CmdClaim:
		return s.claim(ctx, c)
	case api.CmdPushTime:
		sess, err := s.session()
		if err != nil {
			return nil, err
		}
		at, err := sess.PushTime()
		if err != nil {
			return nil, err
		}
		return api.TimeResult{TimeUnixNano: at.UnixNano()}, nil
	}
	return nil, api.Refuse(api.AnswerUnknownCommand, fmt.Errorf("unknown command %q", c.Cmd))
}

func (s *shim) stopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped || len(s.stopReq) > 0
}

func (s *shim) policyEvent(msg string) {
	e := s.broker.PolicyEvent(msg)
	e.Time = time.Now().UTC()
	s.emit(e)
}

func (s *shim) status() api.StatusResult {
	st := s.ctrl.Status()
	// A forward added after ready gives the host a URL now.
	if st.State == api.StateReady && st.GuestURL == "" && st.URL != "" {
		if host := s.fwd.URLFor(st.URL); host != "" {
			st.URL, st.GuestURL = host, st.URL
		}
	}
	s.mu.Lock()
	connected := s.sess != nil
	s.mu.Unlock()
	return api.StatusResult{Status: st, GuestConnected: connected, Forwards: s.fwd.List(), Egress: nonNil(s.broker.Policy().Describe())}
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}
