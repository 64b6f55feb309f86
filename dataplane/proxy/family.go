package proxy

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// A Service proxy is driven per address family. Each mode's Backend serves
// one family (Config.Family), and a dual-stack node runs one Backend per
// family behind PerFamily, which hands each the ServicePorts of its family,
// the way kube-proxy's metaproxier drives two single-stack proxiers. One
// instance per family rather than one native dual-stack backend, because
// what a backend programs is already split by family in the kernel:
// iptables and ip6tables are separate tables written by separate
// iptables-restore runs, conntrack has a table per family, BPF maps are
// keyed by address width. The ServicePorts themselves are built per family
// (BuildServicePorts), so the split costs nothing, and a backend never has
// to ask which family an address is.

// PerFamily drives one Backend per address family: each Sync hands every
// Backend the ports of its family, the same full flag, and of changed only
// the Services whose ports of that family are not the ones it was handed
// last (an IPv4 endpoint change leaves the IPv6 Backend alone: State keeps
// a ServicePort that is built again unchanged, so identity tells). Its
// SyncResult sums the rule counts. It closes the Backends that are
// io.Closers.
type PerFamily struct {
	Backends map[ipfamily.Family]Backend
	// handed is each family's map of ports its Backend got at its last
	// successful Sync; a partial sync updates it in place for the changed
	// Services only (as State does its own), so one endpoint change costs
	// those, not a walk of every Service (at 5,000 dual-stack Services
	// building both maps again was 4.6 ms a change, a quarter of its CPU).
	handed map[ipfamily.Family]map[cluster.Key][]*ServicePort
}

// NewPerFamily returns a PerFamily of bs.
func NewPerFamily(bs map[ipfamily.Family]Backend) *PerFamily {
	return &PerFamily{Backends: bs, handed: make(map[ipfamily.Family]map[cluster.Key][]*ServicePort)}
}

// Sync implements Backend. Every family is synced even when one fails; the
// error names the family.
func (p *PerFamily) Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error) {
	res := SyncResult{Rules: make(map[string]int)}
	var errs []error
	for _, f := range ipfamily.All {
		b, ok := p.Backends[f]
		if !ok {
			continue
		}
		mine, ch := p.split(ports, changed, full, f)
		r, err := b.Sync(mine, ch, full)
		p.handed[f] = mine
		if err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", f, err))
			delete(p.handed, f)
		}
		for k, n := range r.Rules {
			res.Rules[k] += n
		}
	}
	return res, errors.Join(errs...)
}

// split returns family f's ports and changed Services. A partial sync after
// a successful one updates the map handed last for the Services in changed
// and keeps of those the ones whose ports of f differ; otherwise (full, a
// nil changed meaning every Service, nothing handed yet or the last Sync
// failed) the map is built again and changed handed on as it is.
func (p *PerFamily) split(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool, f ipfamily.Family) (map[cluster.Key][]*ServicePort, map[cluster.Key]bool) {
	last := p.handed[f]
	if full || changed == nil || last == nil {
		return portsOf(ports, f), changed
	}
	mine := make(map[cluster.Key]bool, len(changed))
	for k := range changed {
		now := familyPorts(ports[k], f)
		if slices.Equal(last[k], now) {
			continue
		}
		mine[k] = true
		if now == nil {
			delete(last, k)
		} else {
			last[k] = now
		}
	}
	return last, mine
}

// Close closes the Backends that are io.Closers.
func (p *PerFamily) Close() error {
	var errs []error
	for _, b := range p.Backends {
		if c, ok := b.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// portsOf returns the ports of family f, by Service; a Service without
// one is absent.
func portsOf(ports map[cluster.Key][]*ServicePort, f ipfamily.Family) map[cluster.Key][]*ServicePort {
	out := make(map[cluster.Key][]*ServicePort, len(ports))
	for k, sps := range ports {
		if mine := familyPorts(sps, f); mine != nil {
			out[k] = mine
		}
	}
	return out
}

// familyPorts are the ports of sps of family f, nil when none is. The slice
// is sps itself when its ports are all of f, so a Backend keying by
// ServicePort identity sees the same ones.
func familyPorts(sps []*ServicePort, f ipfamily.Family) []*ServicePort {
	n := 0
	for _, sp := range sps {
		if sp.Family() == f {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(sps):
		return sps
	}
	mine := make([]*ServicePort, 0, n)
	for _, sp := range sps {
		if sp.Family() == f {
			mine = append(mine, sp)
		}
	}
	return mine
}
