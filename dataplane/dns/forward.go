package dns

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
)

// Policy orders the upstreams tried for one query.
type Policy int

const (
	PolicyRandom Policy = iota
	PolicyRoundRobin
	PolicySequential
)

// ParsePolicy reads the --policy flag value.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "random":
		return PolicyRandom, nil
	case "round_robin":
		return PolicyRoundRobin, nil
	case "sequential":
		return PolicySequential, nil
	}
	return 0, fmt.Errorf("policy %q: want random, round_robin or sequential", s)
}

// ForwardOptions configures a Forwarder.
type ForwardOptions struct {
	Upstreams []netip.AddrPort
	Policy    Policy
	// TryTimeout bounds one upstream exchange (2 s); Deadline bounds a
	// whole forwarded query, every try included (5 s).
	TryTimeout, Deadline time.Duration
	// MaxConcurrent caps forwarded queries in flight; past it, REFUSED.
	MaxConcurrent int
	// MaxFails consecutive failures mark an upstream down (2); it is then
	// probed every HealthInterval (500 ms) until it answers.
	MaxFails       int
	HealthInterval time.Duration
	// Forbidden are addresses that are dnsd itself (its listen addresses,
	// the kube-dns VIP): an upstream among them would be a loop.
	Forbidden []netip.AddrPort
	Logger    *slog.Logger
	// Stubs forward their domains to their own upstreams (the config
	// file's stubDomains), with the options above; the most specific
	// domain wins.
	Stubs []Stub
	// Hosts answer A and AAAA for fixed names (lowercase FQDNs) before
	// any upstream is asked.
	Hosts map[string][]netip.Addr
}

func (o *ForwardOptions) setDefaults() {
	if o.TryTimeout <= 0 {
		o.TryTimeout = 2 * time.Second
	}
	if o.Deadline <= 0 {
		o.Deadline = 5 * time.Second
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 1000
	}
	if o.MaxFails <= 0 {
		o.MaxFails = 2
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// ErrNoUpstream is returned when no upstream may be asked: none configured,
// all down, or all found to loop back to dnsd.
var ErrNoUpstream = errors.New("no usable upstream")

// Forwarder sends queries to upstream resolvers.
type Forwarder struct {
	opts     ForwardOptions
	ups      []*upstream
	rejected []error
	rr       atomic.Uint32
	sem      chan struct{}
	done     chan struct{}
	doneOnce sync.Once
	metrics  *Metrics
	forged   atomic.Uint64
	stubs    []stubForwarder
	hosts    map[string][]netip.Addr // by lowercase wire name
}

type stubForwarder struct {
	domain []byte // lowercase wire name
	fwd    *Forwarder
}

type upstream struct {
	addr  netip.AddrPort
	probe []byte // wire name of this upstream's loop probe
	fails atomic.Int32
	down  atomic.Bool
	loop  atomic.Bool
}

// NewForwarder checks the upstreams; those that are dnsd itself are left
// out and reported by Rejected. It fails when none is left.
func NewForwarder(opts ForwardOptions) (*Forwarder, error) {
	opts.setDefaults()
	f := &Forwarder{opts: opts, sem: make(chan struct{}, opts.MaxConcurrent), done: make(chan struct{})}
	local := localAddrs()
	tag := rand.Uint64()
	for i, u := range opts.Upstreams {
		if err := loopsBack(u, opts.Forbidden, local); err != nil {
			f.rejected = append(f.rejected, err)
			continue
		}
		probe := wireName(fmt.Sprintf("%x-%d.podnet-loop-detect", tag, i))
		f.ups = append(f.ups, &upstream{addr: u, probe: probe})
	}
	if len(f.ups) == 0 {
		return nil, fmt.Errorf("forwarder: %w (%d configured, %d rejected: %v)", ErrNoUpstream, len(opts.Upstreams), len(f.rejected), errors.Join(f.rejected...))
	}
	for _, st := range opts.Stubs {
		so := opts
		so.Upstreams, so.Stubs, so.Hosts = st.Upstreams, nil, nil
		sf, err := NewForwarder(so)
		if err != nil {
			return nil, fmt.Errorf("stub domain %s: %w", st.Domain, err)
		}
		f.stubs = append(f.stubs, stubForwarder{domain: wireName(st.Domain), fwd: sf})
	}
	if len(opts.Hosts) > 0 {
		f.hosts = make(map[string][]netip.Addr, len(opts.Hosts))
		for name, addrs := range opts.Hosts {
			f.hosts[string(wireName(strings.ToLower(name)))] = addrs
		}
	}
	return f, nil
}

// StubDomains lists the stub domains and their upstreams, most specific
// first.
func (f *Forwarder) StubDomains() []Stub {
	var out []Stub
	for _, s := range f.stubs {
		out = append(out, Stub{Domain: presentName(s.domain), Upstreams: s.fwd.Upstreams()})
	}
	return out
}

// route returns the forwarder for a lowercase wire name: a stub domain's,
// or f itself.
func (f *Forwarder) route(lower []byte) *Forwarder {
	for _, s := range f.stubs {
		if inDomain(lower, s.domain) {
			return s.fwd
		}
	}
	return f
}

// inDomain reports whether the wire name n is domain or under it.
func inDomain(n, domain []byte) bool {
	if !bytes.HasSuffix(n, domain) {
		return false
	}
	// The suffix must start at a label boundary.
	for i := 0; i < len(n); i += int(n[i]) + 1 {
		if i == len(n)-len(domain) {
			return true
		}
		if n[i] == 0 {
			break
		}
	}
	return false
}

// host returns the configured addresses of a lowercase wire name.
func (f *Forwarder) host(lower []byte) ([]netip.Addr, bool) {
	if f.hosts == nil {
		return nil, false
	}
	a, ok := f.hosts[string(lower)]
	return a, ok
}

// Rejected lists the configured upstreams that were left out, and why.
func (f *Forwarder) Rejected() []error { return f.rejected }

// Upstreams lists the upstreams in use.
func (f *Forwarder) Upstreams() []netip.AddrPort {
	out := make([]netip.AddrPort, len(f.ups))
	for i, u := range f.ups {
		out[i] = u.addr
	}
	return out
}

// Healthy reports whether an upstream (of f or of a stub domain) is in use
// (not down, not looping).
func (f *Forwarder) Healthy(a netip.AddrPort) bool {
	for _, u := range f.ups {
		if u.addr == a {
			return !u.down.Load() && !u.loop.Load()
		}
	}
	for _, s := range f.stubs {
		if s.fwd.Healthy(a) {
			return true
		}
	}
	return false
}

// Looping reports whether a forwarding loop was detected through a.
func (f *Forwarder) Looping(a netip.AddrPort) bool {
	for _, u := range f.ups {
		if u.addr == a {
			return u.loop.Load()
		}
	}
	return false
}

func loopsBack(u netip.AddrPort, forbidden []netip.AddrPort, local map[netip.Addr]bool) error {
	ua := u.Addr().Unmap()
	for _, f := range forbidden {
		fa := f.Addr().Unmap()
		if f.Port() != u.Port() {
			continue
		}
		if fa == ua || (fa.IsUnspecified() && (ua.IsLoopback() || ua.IsUnspecified() || local[ua])) {
			return fmt.Errorf("upstream %s is dnsd itself (%s): forwarding loop, not used", u, f)
		}
	}
	return nil
}

func localAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out
}

// Run sends one loop probe through every upstream (a query only dnsd
// knows: if it comes back to dnsd, that upstream forwards to dnsd), then
// waits for ctx to end and stops the health checks.
func (f *Forwarder) Run(ctx context.Context) {
	defer f.doneOnce.Do(func() { close(f.done) })
	for _, s := range f.stubs {
		go s.fwd.Run(ctx)
	}
	for _, u := range f.ups {
		go func() {
			q := new(mdns.Msg)
			q.SetQuestion(presentName(u.probe), mdns.TypeHINFO)
			f.try(ctx, u, q, time.Now().Add(f.opts.TryTimeout))
		}()
	}
	<-ctx.Done()
}

// isProbe reports whether name is one of our loop probes, and marks its
// upstream as looping.
func (f *Forwarder) isProbe(name []byte) bool {
	for _, s := range f.stubs {
		if s.fwd.isProbe(name) {
			return true
		}
	}
	for _, u := range f.ups {
		if bytes.Equal(name, u.probe) {
			if !u.loop.Swap(true) {
				f.opts.Logger.Error("forwarding loop detected: upstream sends dnsd's own queries back to it; no longer forwarding to it", "upstream", u.addr.String())
			}
			return true
		}
	}
	return false
}

func (f *Forwarder) roomFor() bool { return len(f.sem) < cap(f.sem) }

func (f *Forwarder) acquire() bool {
	select {
	case f.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (f *Forwarder) release() { <-f.sem }

// order returns the usable upstreams in the order the policy tries them.
func (f *Forwarder) order() []*upstream {
	out := make([]*upstream, 0, len(f.ups))
	for _, u := range f.ups {
		if !u.down.Load() && !u.loop.Load() {
			out = append(out, u)
		}
	}
	switch f.opts.Policy {
	case PolicyRandom:
		rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	case PolicyRoundRobin:
		if len(out) > 1 {
			k := int(f.rr.Add(1)) % len(out)
			out = append(out[k:], out[:k]...)
		}
	}
	return out
}

// candidates are the upstreams to try, in policy order. When every one is
// marked down, as CoreDNS's forward, it takes the health checks for broken
// and returns them all anyway (but those that loop), so an upstream that
// is back answers at once rather than after the next check.
func (f *Forwarder) candidates() []*upstream {
	ups := f.order()
	if len(ups) > 0 {
		return ups
	}
	if f.metrics != nil {
		f.metrics.healthcheckBroken.Inc()
	}
	for _, u := range f.ups {
		if !u.loop.Load() {
			ups = append(ups, u)
		}
	}
	return ups
}

// Exchange forwards q and returns the first good answer, trying the
// upstreams in policy order, again and again (up to three rounds) while the
// deadline allows, so one lost datagram does not fail the query. SERVFAIL
// and REFUSED answers move on to the next upstream (and are returned if no
// other answers). Upstreams marked down are tried only when all are, and
// then in every round. It fails with ErrNoUpstream when every upstream loops
// back to dnsd, and when none answered within the deadline.
func (f *Forwarder) Exchange(ctx context.Context, q *mdns.Msg) (*mdns.Msg, error) {
	if len(f.stubs) > 0 && len(q.Question) == 1 {
		if sf := f.route(wireName(strings.ToLower(q.Question[0].Name))); sf != f {
			return sf.Exchange(ctx, q)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.Deadline)
	defer cancel()
	ups := f.candidates()
	if len(ups) == 0 {
		return nil, ErrNoUpstream
	}
	deadline, _ := ctx.Deadline()
	var (
		last    *mdns.Msg
		lastErr error
	)
	for round := 0; round < 3 && last == nil; round++ {
		for _, u := range ups {
			if ctx.Err() != nil {
				break
			}
			if round > 0 && (u.loop.Load() || u.down.Load() && anyUsable(ups)) {
				continue
			}
			if f.metrics != nil {
				f.metrics.forwardRequests.WithLabelValues(u.addr.String()).Inc()
			}
			began := time.Now()
			try := began.Add(f.opts.TryTimeout)
			if deadline.Before(try) {
				try = deadline
			}
			m, err := f.try(ctx, u, q, try)
			if err != nil {
				lastErr = err
				f.failed(u)
				continue
			}
			if f.metrics != nil {
				f.metrics.upstreamAnswered(u.addr.String(), m.Rcode, time.Since(began))
			}
			u.fails.Store(0)
			if m.Rcode == mdns.RcodeServerFailure || m.Rcode == mdns.RcodeRefused {
				last = m
				continue
			}
			return m, nil
		}
	}
	if last != nil {
		return last, nil
	}
	return nil, fmt.Errorf("forward %s: %w: %w", q.Question[0].Name, ErrNoUpstream, lastErr)
}

// anyUsable reports whether one of ups is neither marked down nor looping:
// then the retry rounds skip those marked down. When none is usable (an
// only upstream marked down by this very query's timeouts, say) they are
// all tried again while the deadline allows, as in the first round.
func anyUsable(ups []*upstream) bool {
	for _, u := range ups {
		if !u.down.Load() && !u.loop.Load() {
			return true
		}
	}
	return false
}

func (f *Forwarder) failed(u *upstream) {
	if int(u.fails.Add(1)) >= f.opts.MaxFails && u.down.CompareAndSwap(false, true) {
		f.opts.Logger.Warn("upstream down", "upstream", u.addr.String())
		go f.healthCheck(u)
	}
}

// healthCheck probes a down upstream with ". NS" until it answers.
func (f *Forwarder) healthCheck(u *upstream) {
	t := time.NewTicker(f.opts.HealthInterval)
	defer t.Stop()
	q := new(mdns.Msg)
	q.SetQuestion(".", mdns.TypeNS)
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		if _, err := f.try(context.Background(), u, q, time.Now().Add(min(f.opts.TryTimeout, time.Second))); err == nil {
			u.fails.Store(0)
			u.down.Store(false)
			f.opts.Logger.Info("upstream up", "upstream", u.addr.String())
			return
		}
		if f.metrics != nil {
			f.metrics.healthcheckFailed(u.addr.String())
		}
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 65535); return &b }}

// try is one exchange with one upstream over UDP (a fresh socket, so a
// fresh source port, and a fresh random ID), retried over TCP when the
// answer is truncated. Answers whose ID or question do not match are
// dropped as forged and the wait goes on.
func (f *Forwarder) try(ctx context.Context, u *upstream, q *mdns.Msg, deadline time.Time) (*mdns.Msg, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(u.addr))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", u.addr, err)
	}
	defer c.Close()
	defer bindDeadline(ctx, c, deadline)()
	qq, pkt, err := withFreshID(q)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(pkt); err != nil {
		return nil, fmt.Errorf("send to %s: %w", u.addr, err)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("read from %s: %w", u.addr, err)
		}
		m := new(mdns.Msg)
		if m.Unpack(buf[:n]) != nil || !answers(m, qq) {
			f.dropForged()
			continue
		}
		if m.Truncated {
			return f.tryTCP(ctx, u, q, deadline)
		}
		return m, nil
	}
}

// withFreshID copies q under a new random ID, so every upstream try can be
// told apart from forged or late answers, and packs it.
func withFreshID(q *mdns.Msg) (*mdns.Msg, []byte, error) {
	qq := *q
	qq.Id = uint16(rand.Uint32())
	pkt, err := qq.Pack()
	if err != nil {
		return nil, nil, fmt.Errorf("pack query: %w", err)
	}
	return &qq, pkt, nil
}

// bindDeadline sets c's deadline and cuts it short when ctx ends; call the
// returned func when done with c.
func bindDeadline(ctx context.Context, c net.Conn, deadline time.Time) (stop func() bool) {
	c.SetDeadline(deadline)
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
}

// dropForged counts an answer dropped for not matching its query.
func (f *Forwarder) dropForged() {
	f.forged.Add(1)
	if f.metrics != nil {
		f.metrics.forged.Inc()
	}
}

// answers reports whether m is a response to q: same ID, same question.
func answers(m, q *mdns.Msg) bool {
	if !m.Response || m.Id != q.Id || len(m.Question) != 1 {
		return false
	}
	a, b := m.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

func (f *Forwarder) tryTCP(ctx context.Context, u *upstream, q *mdns.Msg, deadline time.Time) (*mdns.Msg, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", u.addr.String())
	if err != nil {
		return nil, fmt.Errorf("dial tcp %s: %w", u.addr, err)
	}
	defer c.Close()
	defer bindDeadline(ctx, c, deadline)()
	qq, pkt, err := withFreshID(q)
	if err != nil {
		return nil, err
	}
	out := binary.BigEndian.AppendUint16(nil, uint16(len(pkt)))
	if _, err := c.Write(append(out, pkt...)); err != nil {
		return nil, fmt.Errorf("send to %s over tcp: %w", u.addr, err)
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, fmt.Errorf("read from %s over tcp: %w", u.addr, err)
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, fmt.Errorf("read from %s over tcp: %w", u.addr, err)
	}
	m := new(mdns.Msg)
	if err := m.Unpack(buf); err != nil || !answers(m, qq) {
		f.dropForged()
		return nil, fmt.Errorf("bad answer from %s over tcp", u.addr)
	}
	return m, nil
}
