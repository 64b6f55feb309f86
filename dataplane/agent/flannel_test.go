package agent

import (
	"net/netip"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/routing"
)

// TestFlannelAnnotations: the node publishes its first InternalIP (its
// VXLAN underlay) and the MAC podnet's device gets from it, on its VNI.
func TestFlannelAnnotations(t *testing.T) {
	self := &cluster.Node{Name: "n1", InternalIPs: []netip.Addr{netip.MustParseAddr("192.168.10.11"), netip.MustParseAddr("fd00::11")}}
	a, err := flannelAnnotations(Options{NodeName: "n1", VXLANVNI: 1}, self)
	if err != nil {
		t.Fatal(err)
	}
	f := cluster.ParseFlannel(a)
	if f == nil || f.Err != "" || f.PublicIP != self.InternalIPs[0] || f.VTEPMAC.String() != routing.VTEPMAC(self.InternalIPs[0]).String() || f.VNI != 1 {
		t.Errorf("annotations %v read as %+v", a, f)
	}
	if _, err := flannelAnnotations(Options{NodeName: "n1"}, &cluster.Node{Name: "n1"}); err == nil {
		t.Error("no error for a node without an InternalIP")
	}
}
