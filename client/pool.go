package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// PoolOptions say how a Pool boots its warm sandboxes.
type PoolOptions struct {
	// Options are the operator's start options, the same for every
	// sandbox of the pool: Shim, Provider, Agent, SandboxIO, Install,
	// KeepRoot, BootTimeout, Timeout, History, Args, Env, Stderr, OnEvent.
	// Name is the prefix of the sandboxes' names (default "pool"): each is
	// NAME-<8 hex>. The tenant's (Bootstrap, Password, Identity, Forwards,
	// Allow, Upstreams) come with each claim and are refused here, as are
	// Kept and Outlive (a pool stops what it holds).
	Options Options
	// Size is how many warm sandboxes the pool keeps (at least 1).
	Size int
	// MaxBoots bounds the boots the pool runs at once to refill (default
	// 2). A miss boots for its caller at once, as a cold start would.
	MaxBoots int
	// MaxAge is --warm-max-age: a sandbox warm that long stops by itself
	// and the pool boots another (0: no bound).
	MaxAge time.Duration
	// OnEvent, when set, sees every PoolEvent in order. It runs with the
	// pool locked: it must not block nor call the Pool.
	OnEvent func(PoolEvent)
}

// PoolEventKind says what happened in a Pool.
type PoolEventKind string

const (
	// PoolHit: a claim took a warm sandbox (Age: how long it was warm).
	PoolHit PoolEventKind = "hit"
	// PoolMiss: a claim found none warm and boots one for itself.
	PoolMiss PoolEventKind = "miss"
	// PoolRefillStarted: the pool boots a sandbox to keep Size warm.
	PoolRefillStarted PoolEventKind = "refill_started"
	// PoolRefillWarm: that sandbox is warm (Age: how long its boot took).
	PoolRefillWarm PoolEventKind = "refill_warm"
	// PoolExpired: a warm sandbox stopped at MaxAge and its shim exited
	// (Age: how long it was warm); its replacement is booting already.
	PoolExpired PoolEventKind = "expired"
	// PoolFailed: a boot failed, a warm sandbox failed or went away (once
	// its shim exited), or a claimed one failed before ready (Err says
	// why).
	PoolFailed PoolEventKind = "failed"
)

// PoolEvent is one thing that happened in a Pool.
type PoolEvent struct {
	Kind    PoolEventKind
	Time    time.Time
	Sandbox string        // the sandbox's name ("" for a miss before its boot)
	Age     time.Duration // see the kinds
	// Warm and Booting are how many sandboxes are warm and booting to
	// refill once this happened.
	Warm, Booting int
	Err           error
}

// ClaimInfo says how a Pool's claim was served.
type ClaimInfo struct {
	// Hit says a warm sandbox was taken; false is a miss: one was booted
	// for this claim.
	Hit bool
	// Sandbox is the sandbox's name.
	Sandbox string
	// Age is how long the sandbox was warm before the claim (on a miss,
	// how long its boot took).
	Age time.Duration
	// Result is the claim's answer, Ready the ready event (URL, Username;
	// the password is the Shim's Password).
	Result api.ClaimResult
	Ready  api.Event
}

// ErrPoolClosed is returned by Claim once Close was called.
var ErrPoolClosed = errors.New("client: the pool is closed")

// Pool keeps warm sandboxes (oac-shim run --warm) of one configuration
// and hands them out by Claim. See NewPool.
type Pool struct {
	o      PoolOptions
	ctx    context.Context // ends with Close: the refills and the watches
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	warm      []*member // oldest first
	refilling int
	live      map[*Shim]struct{} // every shim the pool holds or boots
	closed    bool
	failures  int // boots failed in a row: the refill backs off
	retryAt   time.Time
	retry     *time.Timer
}

// member is a warm sandbox of the pool.
type member struct {
	s      *Shim
	warmAt time.Time
	boot   time.Duration
	seq    uint64 // the warm event's
	// miss is set on a sandbox booted for a claim that missed, until it
	// joins the pool (giveBack).
	miss bool
	// age is how long it was warm when a claim took it.
	age time.Duration
	// taken is set while a claim holds it: its watch leaves it to the claim.
	taken bool
}

const (
	defaultMaxBoots = 2
	backoffMin      = 250 * time.Millisecond
	backoffMax      = 30 * time.Second
)

// NewPool starts a pool and its first refills: it returns at once, the
// sandboxes become warm in the background (PoolRefillWarm). ctx bounds
// only the checks. Close it to stop what it holds.
func NewPool(ctx context.Context, o PoolOptions) (*Pool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.Size < 1 {
		return nil, errors.New("client: PoolOptions.Size must be at least 1")
	}
	if o.MaxBoots <= 0 {
		o.MaxBoots = defaultMaxBoots
	}
	if o.MaxAge < 0 {
		return nil, errors.New("client: PoolOptions.MaxAge must not be negative")
	}
	so := &o.Options
	if so.Bootstrap != nil || so.Password != "" || so.Identity != nil || len(so.Forwards) > 0 || len(so.Allow) > 0 || len(so.Upstreams) > 0 {
		return nil, errors.New("client: a pool boots for nobody: Bootstrap, Password, Identity, Forwards, Allow and Upstreams are the tenant's and come with each Claim")
	}
	if so.Kept || so.Outlive {
		return nil, errors.New("client: a pool's sandboxes are throwaway and stop with it: leave Kept and Outlive unset")
	}
	if so.Name == "" {
		so.Name = "pool"
	}
	if len(so.Name) > 63-9 {
		return nil, fmt.Errorf("client: the pool's name prefix %q is too long: at most 54 characters", so.Name)
	}
	so.Args = append(slices.Clone(so.Args), "--warm")
	if o.MaxAge > 0 {
		so.Args = append(so.Args, "--warm-max-age", o.MaxAge.String())
	}
	p := &Pool{o: o, live: map[*Shim]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.mu.Lock()
	p.fill()
	p.mu.Unlock()
	return p, nil
}

// Claim takes the oldest warm sandbox that is still warm and alive (a
// hit) or, with none, boots one (a miss), claims it with r and waits for
// ready. The Shim is then the caller's (the pool forgets it: stop it
// with Stop), and the pool refills. When r's bootstrap has credentials
// without a password, one is made here (NewPassword) and put there: the
// Shim's Password returns it. A claim refused for its input
// (invalid_argument) or for volumes the provider cannot mount
// (unsupported) leaves the sandbox warm in the pool; a sandbox that
// fails before ready is stopped and its error returned.
func (p *Pool) Claim(ctx context.Context, r ClaimRequest) (*Shim, ClaimInfo, error) {
	boot, password, err := withPassword(r.Bootstrap)
	if err != nil {
		return nil, ClaimInfo{}, err
	}
	r.Bootstrap = boot
	// Before a sandbox is taken: no warm one is used up by a working
	// directory that cannot be read.
	if r.Volumes, err = absVolumes(r.Volumes); err != nil {
		return nil, ClaimInfo{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, ClaimInfo{}, err
		}
		m, err := p.take()
		if err != nil {
			return nil, ClaimInfo{}, err
		}
		info := ClaimInfo{Hit: m != nil}
		if m == nil {
			if m, err = p.boot(ctx, p.newName()); err != nil {
				p.event(PoolEvent{Kind: PoolFailed, Err: err})
				return nil, info, err
			}
			m.miss, m.age = true, m.boot
		}
		info.Sandbox, info.Age = m.s.Name(), m.age
		res, err := m.s.Claim(ctx, r)
		if err != nil {
			// Only an answer that refused the input (invalid_argument), or
			// volumes its provider cannot mount (unsupported: every sandbox
			// of the pool would say so), says the bootstrap was not taken:
			// then the sandbox is still warm and nobody's.
			var ce *CommandError
			if errors.As(err, &ce) && (ce.Code == api.AnswerInvalidArgument || ce.Code == api.AnswerUnsupported) {
				p.giveBack(m)
				return nil, info, err
			}
			// Maybe claimed (ctx ended after the command went), or it left
			// the warm state since it was taken (conflict, exited): it is
			// never handed out again.
			p.drop(m, fmt.Errorf("client: claim %s: %w", m.s.Name(), err))
			if !info.Hit || ctx.Err() != nil {
				return nil, info, err
			}
			continue
		}
		p.forget(m.s) // and refill
		m.s.password = password
		info.Result = res
		ready, err := m.s.WaitState(ctx, api.StateReady)
		if err != nil {
			p.event(PoolEvent{Kind: PoolFailed, Sandbox: m.s.Name(), Err: err})
			m.s.abandon()
			return nil, info, err
		}
		info.Ready = ready
		return m.s, info, nil
	}
}

// take removes the oldest healthy warm sandbox from the pool and reports
// a hit, or reports a miss (nil). The refill starts once the claim is
// answered: a sandbox whose claim is refused for its input comes back.
func (p *Pool) take() (*member, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPoolClosed
	}
	for i, m := range p.warm {
		if !m.s.warmAndAlive() {
			continue // its watch drops it
		}
		p.warm = slices.Delete(p.warm, i, i+1)
		m.taken, m.age = true, time.Since(m.warmAt)
		p.emit(PoolEvent{Kind: PoolHit, Sandbox: m.s.Name(), Age: m.age})
		return m, nil
	}
	p.emit(PoolEvent{Kind: PoolMiss})
	return nil, nil
}

// giveBack returns a sandbox whose claim was refused for its input or its
// volumes: it is still warm. A miss's sandbox joins the pool when there is room.
func (p *Pool) giveBack(m *member) {
	p.mu.Lock()
	m.taken = false
	if !p.closed && m.s.warmAndAlive() && (!m.miss || len(p.warm)+p.refilling < p.o.Size) {
		if m.miss {
			m.miss = false
			p.wg.Add(1)
			go p.watch(m)
		}
		i, _ := slices.BinarySearchFunc(p.warm, m.warmAt, func(x *member, t time.Time) int { return x.warmAt.Compare(t) })
		p.warm = slices.Insert(p.warm, i, m)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.stop(m.s)
}

// drop stops a sandbox that cannot be claimed and says why.
func (p *Pool) drop(m *member, err error) {
	p.mu.Lock()
	p.emit(PoolEvent{Kind: PoolFailed, Sandbox: m.s.Name(), Err: err})
	p.mu.Unlock()
	p.stop(m.s)
}

// stop stops a shim the pool holds, in order, and forgets it.
func (p *Pool) stop(s *Shim) {
	s.abandon()
	p.forget(s)
}

// forget lets a shim go (claimed or stopped) and refills.
func (p *Pool) forget(s *Shim) {
	p.mu.Lock()
	delete(p.live, s)
	p.fill()
	p.mu.Unlock()
}

// fill starts refills until Size are warm or booting, at most MaxBoots at
// once, after a failed boot not before retryAt. p.mu is held.
func (p *Pool) fill() {
	if p.closed {
		return
	}
	if wait := time.Until(p.retryAt); wait > 0 {
		if p.retry == nil {
			p.retry = time.AfterFunc(wait, func() {
				p.mu.Lock()
				p.retry = nil
				p.fill()
				p.mu.Unlock()
			})
		}
		return
	}
	for p.refilling < p.o.MaxBoots && len(p.warm)+p.refilling < p.o.Size {
		p.refilling++
		name := p.newName()
		p.emit(PoolEvent{Kind: PoolRefillStarted, Sandbox: name})
		p.wg.Add(1)
		go p.refill(name)
	}
}

func (p *Pool) refill(name string) {
	defer p.wg.Done()
	m, err := p.boot(p.ctx, name)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refilling--
	if err != nil {
		if !p.closed {
			p.failures++
			p.retryAt = time.Now().Add(min(backoffMin<<min(p.failures-1, 10), backoffMax))
			p.emit(PoolEvent{Kind: PoolFailed, Sandbox: name, Err: err})
			p.fill()
		}
		return
	}
	if p.closed {
		p.wg.Add(1) // Close waits for it
		go func() { defer p.wg.Done(); p.stop(m.s) }()
		return
	}
	p.failures, p.retryAt = 0, time.Time{}
	p.warm = append(p.warm, m)
	p.emit(PoolEvent{Kind: PoolRefillWarm, Sandbox: name, Age: m.boot})
	p.wg.Add(1)
	go p.watch(m)
	p.fill()
}

// boot starts one warm sandbox and waits for its warm state; a boot that
// fails or whose ctx ends leaves nothing.
func (p *Pool) boot(ctx context.Context, name string) (*member, error) {
	o := p.o.Options
	o.Name = name
	began := time.Now()
	s, err := Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("client: boot warm sandbox %s: %w", name, err)
	}
	p.mu.Lock()
	p.live[s] = struct{}{}
	p.mu.Unlock()
	warm, err := s.WaitState(ctx, api.StateWarm)
	if err != nil {
		p.stop(s)
		return nil, fmt.Errorf("client: boot warm sandbox %s: %w", name, err)
	}
	now := time.Now()
	return &member{s: s, warmAt: now, boot: now.Sub(began), seq: warm.Seq}, nil
}

// watch waits for a warm sandbox to leave the warm state unclaimed (its
// maximum age, a failure, a shim that exited), drops it and refills.
func (p *Pool) watch(m *member) {
	defer p.wg.Done()
	var left api.Event
	expired := false
	for e, err := range m.s.Events(p.ctx, FromSeq(m.seq+1)) {
		if err != nil {
			var missed *MissedError
			if errors.As(err, &missed) {
				continue
			}
			return // Close
		}
		if e.Event == api.KindWarmExpired {
			expired = true
		}
		if e.Event == api.KindState && e.State != api.StateWarm {
			left = e
			break
		}
	}
	p.mu.Lock()
	if m.taken || p.closed {
		p.mu.Unlock()
		return // the claim or Close has it
	}
	if i := slices.Index(p.warm, m); i >= 0 {
		p.warm = slices.Delete(p.warm, i, i+1)
	}
	age := time.Since(m.warmAt)
	p.fill() // its replacement boots while it ends
	p.mu.Unlock()
	p.stop(m.s) // it stops by itself: this waits for its shim to exit
	e := PoolEvent{Kind: PoolFailed, Sandbox: m.s.Name(), Age: age}
	switch {
	case expired && left.State == api.StateStopped:
		e.Kind = PoolExpired
	case left.State == "":
		e.Err = fmt.Errorf("client: warm sandbox %s: oac-shim exited", m.s.Name())
	default:
		e.Err = fmt.Errorf("client: warm sandbox %s left the warm state: %s (%s)", m.s.Name(), left.State, left.Message)
	}
	p.event(e) // once its shim is gone
}

// Close stops every warm sandbox the pool holds and every refill in
// flight (not the claimed ones, which are their callers'), and waits
// for their shims to exit. When ctx ends first, what is left is killed
// and ctx's error returned.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.retry != nil {
		p.retry.Stop()
	}
	warm := p.warm
	p.warm = nil
	p.mu.Unlock()
	p.cancel() // the refills abandon their boots, the watches end

	var mu sync.Mutex
	var errs []error
	var stops sync.WaitGroup
	for _, m := range warm {
		stops.Add(1)
		go func() {
			defer stops.Done()
			if err := m.s.Stop(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("client: stop warm sandbox %s: %w", m.s.Name(), err))
				mu.Unlock()
			}
			p.forget(m.s)
		}()
	}
	done := make(chan struct{})
	go func() { stops.Wait(); p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.mu.Lock()
		left := make([]*Shim, 0, len(p.live))
		for s := range p.live {
			left = append(left, s)
		}
		p.mu.Unlock()
		for _, s := range left {
			s.Kill()
		}
		<-done
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// Warm is how many sandboxes are warm in the pool now.
func (p *Pool) Warm() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.warm)
}

// emit reports an event; p.mu is held, which keeps them in order.
func (p *Pool) emit(e PoolEvent) {
	if p.o.OnEvent == nil {
		return
	}
	e.Time, e.Warm, e.Booting = time.Now(), len(p.warm), p.refilling
	p.o.OnEvent(e)
}

func (p *Pool) event(e PoolEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.emit(e)
}

func (p *Pool) newName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return p.o.Options.Name + "-" + hex.EncodeToString(b[:])
}

// warmAndAlive says the shim runs and its last state is warm.
func (s *Shim) warmAndAlive() bool {
	select {
	case <-s.done:
		return false
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := s.next; i > s.oldest(); i-- {
		if e := s.ring[(i-1)%uint64(len(s.ring))]; e.Event == api.KindState {
			return e.State == api.StateWarm
		}
	}
	return false
}

// withPassword puts a fresh password in a bootstrap's credentials when
// they have none, and returns the bootstrap and the daemon's password
// (empty without credentials). Nothing else of the document changes
// but the order of its keys.
func withPassword(boot json.RawMessage) (json.RawMessage, string, error) {
	if len(boot) == 0 {
		return boot, "", nil // the shim refuses it, and says why
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(boot, &doc); err != nil {
		return nil, "", fmt.Errorf("client: the claim's bootstrap is not a JSON object: %w", err)
	}
	raw, ok := doc["credentials"]
	if !ok || string(raw) == "null" {
		return boot, "", nil
	}
	var cred map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cred); err != nil {
		return nil, "", fmt.Errorf("client: the claim's bootstrap: credentials is not an object: %w", err)
	}
	var password string
	if v, ok := cred["password"]; ok {
		if err := json.Unmarshal(v, &password); err != nil {
			return nil, "", errors.New("client: the claim's bootstrap: credentials.password is not a string")
		}
	}
	if password != "" {
		if err := checkPassword(password); err != nil {
			return nil, "", errors.New(strings.Replace(err.Error(), "Options.Password", "the bootstrap's credentials.password", 1))
		}
		return boot, password, nil
	}
	password = NewPassword()
	cred["password"], _ = json.Marshal(password)
	doc["credentials"], _ = json.Marshal(cred)
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, "", fmt.Errorf("client: the claim's bootstrap: %w", err)
	}
	return out, password, nil
}
