package proxy

import (
	"errors"
	"fmt"
	"io"

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
// Backend the ports of its family and the same changed set and full flag.
// Its SyncResult sums the rule counts. It closes the Backends that are
// io.Closers.
type PerFamily map[ipfamily.Family]Backend

// Sync implements Backend. Every family is synced even when one fails; the
// error names the family.
func (p PerFamily) Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error) {
	res := SyncResult{Rules: make(map[string]int)}
	var errs []error
	for _, f := range ipfamily.All {
		b, ok := p[f]
		if !ok {
			continue
		}
		r, err := b.Sync(portsOf(ports, f), changed, full)
		if err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", f, err))
		}
		for k, n := range r.Rules {
			res.Rules[k] += n
		}
	}
	return res, errors.Join(errs...)
}

// Close closes the Backends that are io.Closers.
func (p PerFamily) Close() error {
	var errs []error
	for _, b := range p {
		if c, ok := b.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// portsOf returns the ports of family f, by Service; a Service without
// one is absent. The slices are shared when a Service's ports are all of f,
// so a Backend keying by ServicePort identity sees the same ones.
func portsOf(ports map[cluster.Key][]*ServicePort, f ipfamily.Family) map[cluster.Key][]*ServicePort {
	out := make(map[cluster.Key][]*ServicePort, len(ports))
	for k, sps := range ports {
		n := 0
		for _, sp := range sps {
			if sp.Family() == f {
				n++
			}
		}
		switch n {
		case 0:
		case len(sps):
			out[k] = sps
		default:
			mine := make([]*ServicePort, 0, n)
			for _, sp := range sps {
				if sp.Family() == f {
					mine = append(mine, sp)
				}
			}
			out[k] = mine
		}
	}
	return out
}
