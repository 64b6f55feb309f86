package routing

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// flannelPeer is node n, whose Node carries flannel's annotations, as a
// peer of this node: reached as flannel publishes it, whether flannel
// itself runs there (a node not yet migrated) or podnet speaking for
// itself. Over VXLAN, to its public IP and the VTEP MAC it published (a
// flannel node's is random), on podnet's VNI and port, which must be
// flannel's; over host-gw, via its public IP, which must be on this node's
// subnet. Flannel's VTEP address is its podCIDR's network address, as
// podnet's is, so route and neighbour are as for any podnet peer.
func (c Config) flannelPeer(n *cluster.Node, cidr netip.Prefix) (Peer, string) {
	fl := n.Flannel
	if fl.Err != "" {
		return Peer{}, fmt.Sprintf("%s: flannel annotations: %s", n.Name, fl.Err)
	}
	f := c.family()
	pub, mac := fl.PublicIP, fl.VTEPMAC
	if f == ipfamily.IPv6 {
		pub, mac = fl.PublicIPv6, fl.VTEPMACv6
	}
	if !pub.IsValid() {
		return Peer{}, fmt.Sprintf("%s: flannel annotations give no %v public IP", n.Name, f)
	}
	if fl.Backend == cluster.FlannelBackendHostGW {
		if !c.NodeSubnet.IsValid() || !c.NodeSubnet.Contains(pub) {
			return Peer{}, fmt.Sprintf("%s: flannel host-gw via %s, outside this node's subnet %s", n.Name, pub, c.NodeSubnet)
		}
		return Peer{Name: n.Name, NodeIP: pub, PodCIDR: cidr}, ""
	}
	local, _ := c.vxlanLocal()
	switch {
	case c.Backend == BackendHostGW:
		return Peer{}, fmt.Sprintf("%s: flannel reaches it over VXLAN, and this node runs --backend host-gw", n.Name)
	case ipfamily.Of(pub) != ipfamily.Of(local):
		return Peer{}, fmt.Sprintf("%s: flannel's %v VXLAN runs over %v, this node's over %v", n.Name, f, ipfamily.Of(pub), ipfamily.Of(local))
	case fl.VNI != c.VNI:
		return Peer{}, fmt.Sprintf("%s: flannel VNI %d, this node's is %d (--vxlan-vni)", n.Name, fl.VNI, c.VNI)
	case len(mac) != 6:
		return Peer{}, fmt.Sprintf("%s: flannel annotations give no VTEP MAC", n.Name)
	}
	p := Peer{Name: n.Name, NodeIP: pub, PodCIDR: cidr, VXLAN: true}
	copy(p.VTEPMAC[:], mac)
	return p, ""
}

// mac is the peer's VTEP MAC: the one it published, else the one derived
// from its address.
func (p Peer) mac() net.HardwareAddr {
	if p.VTEPMAC != ([6]byte{}) {
		return net.HardwareAddr(p.VTEPMAC[:])
	}
	return VTEPMAC(p.NodeIP)
}
