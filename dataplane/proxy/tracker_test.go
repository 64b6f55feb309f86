package proxy

import (
	"net/netip"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

func TestTracker(t *testing.T) {
	st := cluster.NewStore()
	tr := NewTracker(st, "n1")
	if _, all := tr.Take(); !all {
		t.Fatal("a new tracker must ask for everything")
	}
	objs := svcObjs(0)
	st.Upsert(objs[1]) // the slice alone marks its Service
	st.Upsert(&cluster.Namespace{Name: "ns"})
	st.Upsert(&cluster.Node{Name: "n2", Zone: "z"})
	select {
	case <-tr.Changed():
	default:
		t.Fatal("no signal after a change")
	}
	dirty, all := tr.Take()
	if all || len(dirty) != 1 || !dirty[cluster.Key{Namespace: "ns", Name: "s0"}] {
		t.Errorf("after a slice, a namespace and another node: dirty %v, all %v; want only ns/s0", dirty, all)
	}
	st.Upsert(&cluster.Node{Name: "n1", Zone: "z2"})
	if _, all := tr.Take(); !all {
		t.Error("a change of this node (its zone decides topology) must ask for everything")
	}
	st.Delete(cluster.KindEndpointSlice, objs[1].Key())
	if dirty, _ := tr.Take(); !dirty[cluster.Key{Namespace: "ns", Name: "s0"}] {
		t.Errorf("deleting a slice: dirty %v", dirty)
	}
}

func TestStateTakesThePodCIDRFromTheNode(t *testing.T) {
	st := cluster.NewStore()
	objs := svcObjs(0)
	for _, o := range objs {
		st.Upsert(o)
	}
	state := NewState(ipfamily.IPv4)
	state.Update(st, "n1", nil, true)
	st.Upsert(&cluster.Node{Name: "n1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	// The node's podCIDR arriving rebuilds every Service.
	if changed := state.Update(st, "n1", nil, false); len(changed) == 0 {
		t.Fatal("this node's podCIDR arriving changed nothing")
	}
	if got := state.node.PodCIDRs; len(got) != 1 {
		t.Errorf("node info podCIDRs %v", got)
	}
}
