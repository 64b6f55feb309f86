package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Probing local endpoints: a Service with trafficDistribution
// PreferSameNode sends a node's traffic to the endpoint on that node while
// the EndpointSlice says it is ready. When its process dies, the slice says
// so only after the kubelet has noticed (its PLEG relists every second:
// 0.9 s after a SIGKILL in the dns-lab, 08:10:37.202 → 38.120) and the
// endpoint controller and the watch have passed it on; meanwhile every
// query of the node's pods is refused, and UDP ones past the kernel's ICMP
// rate limit (6, then 1 a second to a host) get no answer at all. So the
// proxy connects to a TCP port of each such local endpoint every
// ProbeInterval itself, and treats an endpoint whose connect is refused
// (a RST: the pod's network lives, nothing listens) as not ready, so the
// node's traffic falls over to the other nodes' endpoints at once. Only a
// refusal counts: a timeout says nothing (a loaded node, a policy). The
// endpoint is ready again once connects have succeeded for probeHold (its
// replacement's DNS answers only once its data is loaded; by then the
// kubelet has marked it not ready until its readiness probe passes) or
// once the slice no longer lists it as ready.

// probeHold is how long a refused endpoint must accept connections before
// it counts as ready again.
const probeHold = 2 * time.Second

// probeTimeout bounds one connect.
const probeTimeout = time.Second

// localProber connects to the probed local endpoints in rounds and keeps
// which ones refused.
type localProber struct {
	interval time.Duration
	// dial connects to ap and closes the connection; the error tells.
	dial func(ctx context.Context, ap netip.AddrPort) error
	now  func() time.Time
	// changed is told the Services whose endpoints turned down or up;
	// urgent, when set, after an endpoint turned down (the sync that moves
	// its traffic away should not wait for the minimum sync period).
	changed func(keys []cluster.Key)
	urgent  func()
	log     *slog.Logger

	mu sync.Mutex
	// targets are the addresses to probe and the Services each backs.
	targets map[netip.AddrPort][]cluster.Key
	// down are the targets that refused, with when they have accepted
	// connections since (zero: not yet).
	down map[netip.AddrPort]time.Time
}

func newLocalProber(interval time.Duration, changed func([]cluster.Key), log *slog.Logger) *localProber {
	return &localProber{
		interval: interval, dial: dialClose, now: time.Now, changed: changed, log: log,
		targets: map[netip.AddrPort][]cluster.Key{}, down: map[netip.AddrPort]time.Time{},
	}
}

// dialClose connects to ap over TCP and resets the connection.
func dialClose(ctx context.Context, ap netip.AddrPort) error {
	d := net.Dialer{Timeout: probeTimeout}
	c, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		return err
	}
	// A RST instead of a FIN: no TIME_WAIT left behind ten times a second.
	c.(*net.TCPConn).SetLinger(0)
	return c.Close()
}

// Refused reports whether ap refused and has not accepted connections for
// probeHold since. Safe for concurrent use.
func (p *localProber) Refused(ap netip.AddrPort) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, down := p.down[ap]
	return down
}

// setTargets replaces what is probed; targets no longer probed are
// forgotten.
func (p *localProber) setTargets(targets map[netip.AddrPort][]cluster.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets = targets
	for ap := range p.down {
		if _, ok := targets[ap]; !ok {
			delete(p.down, ap)
		}
	}
}

// run probes every interval until ctx ends.
func (p *localProber) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.interval):
		}
		p.round(ctx)
	}
}

// round connects to every target at once and records the outcomes.
func (p *localProber) round(ctx context.Context) {
	p.mu.Lock()
	aps := make([]netip.AddrPort, 0, len(p.targets))
	for ap := range p.targets {
		aps = append(aps, ap)
	}
	p.mu.Unlock()
	if len(aps) == 0 {
		return
	}
	errs := make([]error, len(aps))
	var wg sync.WaitGroup
	for i, ap := range aps {
		wg.Go(func() { errs[i] = p.dial(ctx, ap) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	var keys []cluster.Key
	turnedDown := false
	p.mu.Lock()
	for i, ap := range aps {
		if p.observe(ap, errs[i]) {
			keys = append(keys, p.targets[ap]...)
			_, down := p.down[ap]
			turnedDown = turnedDown || down
		}
	}
	p.mu.Unlock()
	if len(keys) > 0 {
		p.changed(keys)
	}
	if turnedDown && p.urgent != nil {
		p.urgent()
	}
}

// observe records one connect's outcome; true when ap turned down or up.
func (p *localProber) observe(ap netip.AddrPort, err error) bool {
	if _, probed := p.targets[ap]; !probed {
		return false // forgotten meanwhile
	}
	since, down := p.down[ap]
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		p.down[ap] = time.Time{}
		if !down {
			p.log.Info("local endpoint refused a connection: not used until it accepts again", "endpoint", ap, "services", p.targets[ap])
		}
		return !down
	case err != nil || !down:
		return false
	case since.IsZero():
		p.down[ap] = p.now()
		return false
	case p.now().Sub(since) >= probeHold:
		delete(p.down, ap)
		p.log.Info("local endpoint accepts connections again", "endpoint", ap, "services", p.targets[ap])
		return true
	}
	return false
}

// probeLocal returns what to probe of a PreferSameNode Service's ports
// (one family's): the ready local endpoints at the first TCP port's target
// port. Endpoints whose probe refused are made not ready in every port, and
// the ports categorized again, so their traffic goes to other nodes.
func probeLocal(ports []*ServicePort, trafficDistribution string, node NodeInfo, refused func(netip.AddrPort) bool) []netip.AddrPort {
	var probes []netip.AddrPort
	for _, sp := range ports {
		if sp.Protocol != cluster.TCP {
			continue
		}
		for _, e := range sp.Endpoints {
			if e.Local && e.Ready {
				probes = append(probes, e.AddrPort())
			}
		}
		break
	}
	down := map[netip.Addr]bool{}
	for _, ap := range probes {
		if refused(ap) {
			down[ap.Addr()] = true
		}
	}
	if len(down) == 0 {
		return probes
	}
	for _, sp := range ports {
		eps := slices.Clone(sp.Endpoints)
		for i := range eps {
			if eps[i].Local && down[eps[i].Addr()] {
				// Not serving either: its UDP conntrack entries go
				// (StaleUDP), so clients reusing a source port move too.
				eps[i].Ready, eps[i].Serving = false, false
			}
		}
		sp.Endpoints, sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasEndpoints = eps, nil, nil, false
		categorize(sp, trafficDistribution, node)
	}
	return probes
}

// setProbes records key's probe targets.
func (s *State) setProbes(key cluster.Key, probes []netip.AddrPort) {
	if s.probe == nil || slices.Equal(s.probes[key], probes) {
		return
	}
	if len(probes) == 0 {
		delete(s.probes, key)
	} else {
		s.probes[key] = probes
	}
	s.probesChanged = true
}

// Probes returns every probe target and the Services it backs when they
// changed since the last call; nil, false when they did not.
func (s *State) Probes() (map[netip.AddrPort][]cluster.Key, bool) {
	if !s.probesChanged {
		return nil, false
	}
	s.probesChanged = false
	out := map[netip.AddrPort][]cluster.Key{}
	for key, aps := range s.probes {
		for _, ap := range aps {
			out[ap] = append(out[ap], key)
		}
	}
	return out, true
}
