// Package routing gives pods on this node a path to the pods of every other
// node. Plan is a pure function from the cluster's Nodes to what the kernel
// should hold (a VXLAN device, routes, neighbour and FDB entries); a
// Reconciler diffs that plan against what the kernel holds and changes only
// what differs, so a restart touches nothing that is already right and
// established pod connections survive it.
//
// Two ways to reach a peer's podCIDR:
//
//   - host-gw: `PEER_PODCIDR via PEER_NODE_IP`, no encapsulation; the peer
//     must be on this node's own L2 segment.
//   - VXLAN: `PEER_PODCIDR via PEER_VTEP dev podnet.1 onlink`, where
//     PEER_VTEP is the network address of the peer's podCIDR (as flannel
//     does). A permanent neighbour entry maps PEER_VTEP to the peer's VTEP
//     MAC and an FDB entry maps that MAC to the peer's node IP. The MAC is
//     derived from the node IP, so nodes need to exchange nothing beyond
//     what the Node objects already say; the device never learns.
package routing

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Backend chooses how peers are reached.
type Backend string

const (
	BackendAuto   Backend = "auto"    // host-gw on the node's subnet, VXLAN beyond
	BackendHostGW Backend = "host-gw" // host-gw for every peer
	BackendVXLAN  Backend = "vxlan"   // VXLAN for every peer
)

// Defaults.
const (
	DefaultDevice = "podnet.1"
	DefaultVNI    = 1
	DefaultPort   = 8472
	// VXLANOverhead is what encapsulation adds to an IPv4 packet: outer
	// IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
	VXLANOverhead = 50
	// Protocol tags podnet's routes (rtnetlink protocol number), so the
	// reconciler only ever touches routes it made.
	Protocol = 98
)

// Config is what the plan needs besides the Nodes.
type Config struct {
	NodeName string
	Backend  Backend
	// NodeIP is this node's underlay address (the VXLAN source).
	NodeIP netip.Addr
	// NodeSubnet is the underlay subnet of the interface holding NodeIP;
	// peers inside it are reachable with host-gw.
	NodeSubnet netip.Prefix
	// Iface is the underlay interface; its MTU is UnderlayMTU.
	Iface       string
	UnderlayMTU int
	Device      string // VXLAN device name
	VNI         int
	Port        int
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch c.Backend {
	case BackendAuto, BackendHostGW, BackendVXLAN:
	default:
		return fmt.Errorf("backend: %q is not auto, host-gw or vxlan", c.Backend)
	}
	if !c.NodeIP.Is4() {
		return fmt.Errorf("node IP: %v is not an IPv4 address", c.NodeIP)
	}
	if c.VNI < 1 || c.VNI > 1<<24-1 {
		return fmt.Errorf("vxlan VNI: %d out of range 1-16777215", c.VNI)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("vxlan port: %d out of range 1-65535", c.Port)
	}
	if c.UnderlayMTU < 576+VXLANOverhead {
		return fmt.Errorf("underlay MTU: %d too small", c.UnderlayMTU)
	}
	return nil
}

// PodMTU is the MTU pods get. With VXLAN possible (auto, vxlan) it leaves
// room for the encapsulation even while every peer is host-gw, because a
// pod's MTU cannot change once it runs and a far peer may join later.
func (c Config) PodMTU() int {
	if c.Backend == BackendHostGW {
		return c.UnderlayMTU
	}
	return c.UnderlayMTU - VXLANOverhead
}

// VXLANDevice is the desired VXLAN device.
type VXLANDevice struct {
	Name     string
	VNI      int
	Port     int
	Local    netip.Addr
	Parent   string // underlay interface
	MAC      net.HardwareAddr
	MTU      int
	Addr     netip.Prefix // own VTEP address, /32
	Learning bool         // always false; kept visible in dumps
	Up       bool
}

// Route is one route in the main table, tagged with Protocol.
type Route struct {
	Dst    netip.Prefix
	Gw     netip.Addr
	Dev    string
	Onlink bool
}

func (r Route) String() string {
	s := fmt.Sprintf("%s via %s", r.Dst, r.Gw)
	if r.Dev != "" {
		s += " dev " + r.Dev
	}
	if r.Onlink {
		s += " onlink"
	}
	return s
}

// Neigh is a permanent neighbour entry on the VXLAN device.
type Neigh struct {
	Dev string
	IP  netip.Addr
	MAC net.HardwareAddr
}

func (n Neigh) String() string {
	return fmt.Sprintf("%s lladdr %s dev %s permanent", n.IP, n.MAC, n.Dev)
}

// FDB is a permanent forwarding entry on the VXLAN device: frames for MAC
// go to the VTEP at Dst.
type FDB struct {
	Dev string
	MAC net.HardwareAddr
	Dst netip.Addr
}

func (f FDB) String() string {
	return fmt.Sprintf("%s dev %s dst %s self permanent", f.MAC, f.Dev, f.Dst)
}

// Peer is one other node as the plan sees it.
type Peer struct {
	Name    string
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
	VXLAN   bool
}

// Plan is what the kernel should hold.
type Plan struct {
	PodCIDR netip.Prefix // this node's; invalid until the Node has one
	Device  *VXLANDevice // nil when VXLAN is not in use (host-gw backend)
	Peers   []Peer
	Routes  []Route
	Neighs  []Neigh
	FDB     []FDB
	// Skipped names nodes that cannot be routed to, with the reason.
	Skipped []string
}

// VTEPMAC derives a node's VTEP MAC from its IPv4 address: locally
// administered, unicast, 0e:70 followed by the four address bytes.
func VTEPMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0e, 0x70, b[0], b[1], b[2], b[3]}
}

// VTEPAddr is the VXLAN next hop of a node: its podCIDR's network address.
func VTEPAddr(podCIDR netip.Prefix) netip.Addr { return podCIDR.Masked().Addr() }

// Compute returns the plan for this node given every Node of the cluster.
// It is pure: same input, same plan, sorted.
func Compute(c Config, nodes []*cluster.Node) Plan {
	var p Plan
	if self := find(nodes, c.NodeName); self != nil {
		p.PodCIDR, _ = self.PodCIDR()
	}
	if c.Backend != BackendHostGW {
		p.Device = &VXLANDevice{
			Name: c.Device, VNI: c.VNI, Port: c.Port, Local: c.NodeIP, Parent: c.Iface,
			MAC: VTEPMAC(c.NodeIP), MTU: c.UnderlayMTU - VXLANOverhead, Up: true,
		}
		if p.PodCIDR.IsValid() {
			p.Device.Addr = netip.PrefixFrom(VTEPAddr(p.PodCIDR), 32)
		}
	}
	// Two nodes claiming one podCIDR: the first by name keeps it, so the
	// kernel never sees two routes for one prefix.
	owner := make(map[netip.Prefix]string, len(nodes))
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b *cluster.Node) int { return strings.Compare(a.Name, b.Name) })
	p.Peers = make([]Peer, 0, len(nodes))
	p.Routes = make([]Route, 0, len(nodes))
	if c.Backend != BackendHostGW {
		p.Neighs = make([]Neigh, 0, len(nodes))
		p.FDB = make([]FDB, 0, len(nodes))
	}
	for _, n := range sorted {
		if n.Name == c.NodeName {
			continue
		}
		cidr, ok := n.PodCIDR()
		if !ok {
			p.Skipped = append(p.Skipped, n.Name+": no podCIDR")
			continue
		}
		ip, ok := n.InternalIP()
		if !ok {
			p.Skipped = append(p.Skipped, n.Name+": no IPv4 InternalIP")
			continue
		}
		cidr = cidr.Masked()
		if p.PodCIDR.IsValid() && cidr.Overlaps(p.PodCIDR) {
			p.Skipped = append(p.Skipped, fmt.Sprintf("%s: podCIDR %s overlaps this node's %s", n.Name, cidr, p.PodCIDR))
			continue
		}
		vx := c.Backend == BackendVXLAN || (c.Backend == BackendAuto && !c.NodeSubnet.Contains(ip))
		if c.Backend == BackendHostGW && !c.NodeSubnet.Contains(ip) {
			// The kernel refuses a gateway that is not on a connected
			// subnet; say why instead of failing every sync.
			p.Skipped = append(p.Skipped, fmt.Sprintf("%s: %s is outside %s; host-gw needs one L2 segment (use --backend auto or vxlan)", n.Name, ip, c.NodeSubnet))
			continue
		}
		if other, dup := owner[cidr]; dup {
			p.Skipped = append(p.Skipped, fmt.Sprintf("%s: podCIDR %s already used by %s", n.Name, cidr, other))
			continue
		}
		owner[cidr] = n.Name
		p.Peers = append(p.Peers, Peer{Name: n.Name, NodeIP: ip, PodCIDR: cidr, VXLAN: vx})
		if !vx {
			p.Routes = append(p.Routes, Route{Dst: cidr, Gw: ip, Dev: c.Iface})
			continue
		}
		vtep := VTEPAddr(cidr)
		mac := VTEPMAC(ip)
		p.Routes = append(p.Routes, Route{Dst: cidr, Gw: vtep, Dev: c.Device, Onlink: true})
		p.Neighs = append(p.Neighs, Neigh{Dev: c.Device, IP: vtep, MAC: mac})
		p.FDB = append(p.FDB, FDB{Dev: c.Device, MAC: mac, Dst: ip})
	}
	return p
}

func find(nodes []*cluster.Node, name string) *cluster.Node {
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// String renders the plan for golden tests and logs.
func (p Plan) String() string {
	var b strings.Builder
	if p.PodCIDR.IsValid() {
		fmt.Fprintf(&b, "podCIDR %s\n", p.PodCIDR)
	} else {
		b.WriteString("podCIDR none\n")
	}
	if d := p.Device; d != nil {
		fmt.Fprintf(&b, "device %s\n", d)
	}
	for _, r := range p.Routes {
		fmt.Fprintf(&b, "route %s\n", r)
	}
	for _, n := range p.Neighs {
		fmt.Fprintf(&b, "neigh %s\n", n)
	}
	for _, f := range p.FDB {
		fmt.Fprintf(&b, "fdb %s\n", f)
	}
	for _, s := range p.Skipped {
		fmt.Fprintf(&b, "skipped %s\n", s)
	}
	return b.String()
}

func (d *VXLANDevice) String() string {
	learning := "nolearning"
	if d.Learning {
		learning = "learning"
	}
	state := "down"
	if d.Up {
		state = "up"
	}
	addr := "none"
	if d.Addr.IsValid() {
		addr = d.Addr.String()
	}
	return fmt.Sprintf("%s vxlan id %d local %s dev %s dstport %d %s address %s mtu %d addr %s %s",
		d.Name, d.VNI, d.Local, d.Parent, d.Port, learning, d.MAC, d.MTU, addr, state)
}
