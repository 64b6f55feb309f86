package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
)

// flannel's Node annotations (its kube subnet manager, prefix
// flannel.alpha.coreos.com): a node running flannel publishes how to reach
// its podCIDR, and flannel programs every node that says
// kube-subnet-manager "true". podnet reads them so its nodes reach
// flannel's pods while a cluster migrates, and writes them for its own
// Node so flannel's nodes reach podnet's.
const (
	FlannelPrefix         = "flannel.alpha.coreos.com/"
	FlannelBackendType    = FlannelPrefix + "backend-type"
	FlannelBackendData    = FlannelPrefix + "backend-data"
	FlannelBackendV6Data  = FlannelPrefix + "backend-v6-data"
	FlannelPublicIP       = FlannelPrefix + "public-ip"
	FlannelPublicIPv6     = FlannelPrefix + "public-ipv6"
	FlannelSubnetManaged  = FlannelPrefix + "kube-subnet-manager"
	FlannelBackendVXLAN   = "vxlan"
	FlannelBackendHostGW  = "host-gw"
	flannelSubnetManaged1 = "true"
)

// Flannel is what a Node's flannel annotations say: how flannel (or podnet
// speaking for itself) reaches the node's pods.
type Flannel struct {
	Backend string // FlannelBackendVXLAN or FlannelBackendHostGW, as written
	// PublicIP and PublicIPv6 are the underlay addresses of each family
	// (invalid when not given): the VXLAN destination or host-gw gateway.
	PublicIP, PublicIPv6 netip.Addr
	// VNI and VTEPMAC are from backend-data (vxlan), VTEPMACv6 from
	// backend-v6-data.
	VNI                int
	VTEPMAC, VTEPMACv6 net.HardwareAddr
	// Err says why the annotations cannot be used (routing skips the node
	// and says so); empty when they can.
	Err string
}

// FlannelVXLANData is flannel's vxlan backend-data: {"VNI":1,"VtepMAC":"…"}.
type FlannelVXLANData struct {
	VNI     int    `json:"VNI"`
	VtepMAC string `json:"VtepMAC"`
}

// ParseFlannel reads a Node's flannel annotations: nil when the node is not
// managed by flannel's kube subnet manager (no kube-subnet-manager "true"),
// else what they say, with Err naming the annotation that is wrong.
func ParseFlannel(annotations map[string]string) *Flannel {
	if annotations[FlannelSubnetManaged] != flannelSubnetManaged1 {
		return nil
	}
	f := &Flannel{Backend: annotations[FlannelBackendType]}
	if err := f.parse(annotations); err != nil {
		f.Err = err.Error()
	}
	return f
}

func (f *Flannel) parse(a map[string]string) error {
	var err error
	if s := a[FlannelPublicIP]; s != "" {
		if f.PublicIP, err = netip.ParseAddr(s); err != nil {
			return fmt.Errorf("annotation %s: %w", FlannelPublicIP, err)
		}
	}
	if s := a[FlannelPublicIPv6]; s != "" {
		if f.PublicIPv6, err = netip.ParseAddr(s); err != nil {
			return fmt.Errorf("annotation %s: %w", FlannelPublicIPv6, err)
		}
	}
	switch f.Backend {
	case FlannelBackendHostGW:
		return nil
	case FlannelBackendVXLAN:
	default:
		return fmt.Errorf("annotation %s: backend %q is not vxlan or host-gw", FlannelBackendType, f.Backend)
	}
	for _, d := range []struct {
		key string
		mac *net.HardwareAddr
	}{{FlannelBackendData, &f.VTEPMAC}, {FlannelBackendV6Data, &f.VTEPMACv6}} {
		s := a[d.key]
		if s == "" || s == "null" {
			continue
		}
		var v FlannelVXLANData
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return fmt.Errorf("annotation %s: %w", d.key, err)
		}
		if *d.mac, err = net.ParseMAC(v.VtepMAC); err != nil {
			return fmt.Errorf("annotation %s: VtepMAC: %w", d.key, err)
		}
		f.VNI = v.VNI
	}
	return nil
}

// FlannelAnnotations are the annotations flannel's nodes read to reach a
// node over VXLAN: podnet's own, written for its Node while a cluster
// migrates. mac is the node's VTEP MAC, ip its VXLAN underlay address
// (public-ip for IPv4, public-ipv6 for IPv6).
func FlannelAnnotations(vni int, mac net.HardwareAddr, ip netip.Addr) map[string]string {
	data, _ := json.Marshal(FlannelVXLANData{VNI: vni, VtepMAC: mac.String()})
	a := map[string]string{
		FlannelSubnetManaged: flannelSubnetManaged1,
		FlannelBackendType:   FlannelBackendVXLAN,
	}
	if ip.Is4() {
		a[FlannelBackendData], a[FlannelPublicIP] = string(data), ip.String()
	} else {
		a[FlannelBackendV6Data], a[FlannelPublicIPv6] = string(data), ip.String()
	}
	return a
}
