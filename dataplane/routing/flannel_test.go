package routing

import (
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
)

// flannelNode is a node running flannel, as its Node's annotations say.
func flannelNode(name, ip, cidr string, annotations map[string]string) *cluster.Node {
	n := node(name, ip, cidr)
	n.Flannel = cluster.ParseFlannel(annotations)
	return n
}

// TestFlannelPeers: while a cluster migrates node by node, podnet reaches
// flannel's nodes as their annotations say: over VXLAN to the public IP
// with the VTEP MAC flannel published (not one derived from the address)
// even on this node's own subnet, since flannel there sends and expects
// VXLAN; over host-gw via the public IP. A node whose annotations podnet
// cannot follow is skipped with the reason. A podnet node's own
// annotations (cluster.FlannelAnnotations) lead to the entries its
// address alone would.
func TestFlannelPeers(t *testing.T) {
	vxlan := map[string]string{
		cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "vxlan",
		cluster.FlannelBackendData: `{"VNI":1,"VtepMAC":"a6:1f:3c:00:00:02"}`, cluster.FlannelPublicIP: "192.168.10.12",
	}
	hostgw := map[string]string{
		cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "host-gw",
		cluster.FlannelBackendData: "null", cluster.FlannelPublicIP: "192.168.10.13",
	}
	otherVNI := map[string]string{
		cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "vxlan",
		cluster.FlannelBackendData: `{"VNI":4096,"VtepMAC":"a6:1f:3c:00:00:05"}`, cluster.FlannelPublicIP: "192.168.20.15",
	}
	wireguard := map[string]string{cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "wireguard", cluster.FlannelPublicIP: "192.168.20.16"}
	podnetNode := node("node7", "192.168.20.17", "10.244.7.0/24")
	podnetNode.Flannel = cluster.ParseFlannel(cluster.FlannelAnnotations(1, VTEPMAC(podnetNode.InternalIPs[0]), podnetNode.InternalIPs[0]))
	nodes := []*cluster.Node{
		node("node1", "192.168.10.11", "10.244.1.0/24"),
		flannelNode("node2", "192.168.10.12", "10.244.2.0/24", vxlan),
		flannelNode("node3", "192.168.10.13", "10.244.3.0/24", hostgw),
		flannelNode("node5", "192.168.20.15", "10.244.5.0/24", otherVNI),
		flannelNode("node6", "192.168.20.16", "10.244.6.0/24", wireguard),
		podnetNode,
	}
	p := Compute(config(BackendAuto), nodes)
	got := p.String()
	for _, want := range []string{
		"route 10.244.2.0/24 via 10.244.2.0 dev podnet.1 onlink",
		"neigh 10.244.2.0 lladdr a6:1f:3c:00:00:02 dev podnet.1 permanent",
		"fdb a6:1f:3c:00:00:02 dev podnet.1 dst 192.168.10.12 self permanent",
		"route 10.244.3.0/24 via 192.168.10.13 dev eth0",
		"route 10.244.7.0/24 via 10.244.7.0 dev podnet.1 onlink",
		"fdb 0e:70:c0:a8:14:11 dev podnet.1 dst 192.168.20.17 self permanent",
		"skipped node5: flannel VNI 4096, this node's is 1 (--vxlan-vni)",
		`skipped node6: flannel annotations: annotation flannel.alpha.coreos.com/backend-type: backend "wireguard" is not vxlan or host-gw`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("plan lacks %q:\n%s", want, got)
		}
	}
	// The incremental table agrees with the plan.
	tb := NewTable(config(BackendAuto), nodes)
	if tp := tb.Plan().String(); tp != got {
		t.Errorf("table's plan:\n%s\nCompute's:\n%s", tp, got)
	}
	// Without kube-subnet-manager "true" flannel itself ignores the node,
	// and so does podnet's reading: the node is a plain podnet peer.
	delete(vxlan, cluster.FlannelSubnetManaged)
	if cluster.ParseFlannel(vxlan) != nil {
		t.Error("annotations without kube-subnet-manager read as flannel's")
	}
}
