package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
)

// Flows returns the datapath's flow and affinity tables.
func (d *Datapath) Flows() Flows {
	return Flows{
		Fwd:      kernelTable[bpf.NodeportCtKey, bpf.NodeportCtFwdVal]{d.np.Maps[bpf.NodeportMapCtFwdV1]},
		Rev:      kernelTable[bpf.NodeportCtKey, bpf.NodeportCtRevVal]{d.np.Maps[bpf.NodeportMapCtRevV1]},
		Affinity: kernelTable[bpf.SockAffinityKey, bpf.SockAffinityVal]{d.coll.Maps[bpf.SockMapAffinityV2]},
		Backends: d.Maps.Backends,
	}
}

// Flows are the tc programs' flow tables and socket LB's session affinity,
// as Expire reads and deletes them.
type Flows struct {
	Fwd      Table[bpf.NodeportCtKey, bpf.NodeportCtFwdVal]
	Rev      Table[bpf.NodeportCtKey, bpf.NodeportCtRevVal]
	Affinity Table[bpf.SockAffinityKey, bpf.SockAffinityVal]
	Backends Table[uint32, backend]
}

// FlowTarget names flows from outside by where they were sent: the
// frontend they reached (a zero port: any frontend; an invalid address
// with a port: a NodePort, at any node address) and the backend the tc
// programs translated them to.
type FlowTarget struct {
	Frontend netip.AddrPort
	Backend  netip.AddrPort
}

func (ft FlowTarget) matches(k bpf.NodeportCtKey, b netip.AddrPort) bool {
	switch {
	case b != ft.Backend:
		return false
	case ft.Frontend.Port() == 0:
		return true
	case be16(k.Dport) != ft.Frontend.Port():
		return false
	}
	return !ft.Frontend.Addr().IsValid() || addrFrom16(k.Daddr) == ft.Frontend.Addr()
}

// Expire forgets what still sends UDP to a destination that is gone:
//   - the flows the tc programs pinned to one of targets (ct_fwd by the
//     client's 5-tuple, and its reply's ct_rev entry), so the client's next
//     packet from outside picks a backend anew instead of following a
//     flow entry to the old address and port until the LRU evicts it;
//   - the session-affinity entries whose backend is no longer in the
//     backends map (socket LB also checks on lookup; this frees them).
//
// It returns how many flows and affinity entries it removed. An entry the
// kernel evicted meanwhile is not an error.
func (f Flows) Expire(targets []FlowTarget) (flows, affinity int, err error) {
	byBackend := make(map[netip.AddrPort][]FlowTarget, len(targets))
	for _, ft := range targets {
		ft.Backend = netip.AddrPortFrom(ft.Backend.Addr().Unmap(), ft.Backend.Port())
		byBackend[ft.Backend] = append(byBackend[ft.Backend], ft)
	}
	var fwd, rev []bpf.NodeportCtKey
	err = f.Fwd.Each(func(k bpf.NodeportCtKey, v bpf.NodeportCtFwdVal) {
		if k.Proto != protoNum(cluster.UDP) {
			return
		}
		b := netip.AddrPortFrom(addrFrom16(v.Baddr), be16(v.Bport))
		if !slices.ContainsFunc(byBackend[b], func(ft FlowTarget) bool { return ft.matches(k, b) }) {
			return
		}
		fwd = append(fwd, k)
		rev = append(rev, bpf.NodeportCtKey{Saddr: v.Baddr, Sport: v.Bport, Daddr: v.Naddr, Dport: v.Nport, Proto: k.Proto})
	})
	if err != nil {
		return 0, 0, err
	}
	flows, err = deleteEach(f.Fwd, fwd)
	if _, rerr := deleteEach(f.Rev, rev); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if f.Affinity == nil || f.Backends == nil {
		return flows, 0, err
	}
	affinity, aerr := f.expireAffinity()
	return flows, affinity, errors.Join(err, aerr)
}

func (f Flows) expireAffinity() (int, error) {
	bs, err := f.Backends.Dump()
	if err != nil {
		return 0, err
	}
	var stale []bpf.SockAffinityKey
	if err := f.Affinity.Each(func(k bpf.SockAffinityKey, v bpf.SockAffinityVal) {
		if _, ok := bs[v.Backend]; !ok {
			stale = append(stale, k)
		}
	}); err != nil {
		return 0, err
	}
	return deleteEach(f.Affinity, stale)
}

// deleteEach deletes keys one at a time from an LRU map, where the kernel
// may have evicted any of them since they were read; it returns how many
// it deleted.
func deleteEach[K comparable, V any](t Table[K, V], keys []K) (int, error) {
	n := 0
	var errs []error
	for _, k := range keys {
		err := t.Delete([]K{k})
		switch {
		case err == nil:
			n++
		case errors.Is(err, syscall.ENOENT), errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			errs = append(errs, fmt.Errorf("expire flow %v: %w", k, err))
		}
	}
	return n, errors.Join(errs...)
}
