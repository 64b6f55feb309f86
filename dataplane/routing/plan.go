// Package routing gives pods on this node a path to the pods of every other
// node. Compute is a pure function from the cluster's Nodes to the Plan,
// what the kernel should hold (a VXLAN device, routes, neighbour and FDB
// entries); a Table holds the same plan by Node, so that one Node's change
// yields the few entries that differ (a Delta) without walking the rest. A
// Reconciler diffs a plan against what the kernel holds and changes only
// what differs (Apply), so a restart touches nothing that is already right
// and established pod connections survive it, or writes a Delta (Patch).
// Watch reports the kernel's changes, and Table.Matches tells the echoes
// of podnet's own from the changes that need repairing.
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
//
// A plan routes one pod family (Config.Family); a dual-stack node has one
// per family. Host-gw needs the peer's address of the pod family on the
// node's own subnet of that family. VXLAN runs over one underlay family for
// the whole node (Config.Underlay): both pod families then share the one
// device, its FDB entries (one per peer) and its MTU, and each plan holds
// its own family's routes, neighbours and device address. IPv6 pods over
// an IPv4 underlay are as much VXLAN as IPv4 pods over IPv6: the inner
// frame is Ethernet.
package routing

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
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
	// VXLANOverhead is what encapsulation over an IPv4 underlay adds to
	// a pod's packet: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner
	// Ethernet (14); over IPv6 the outer header is 40 bytes, 70 in all
	// (Overhead).
	VXLANOverhead = 50
	// Protocol tags podnet's routes (rtnetlink protocol number), so the
	// reconciler only ever touches routes it made.
	Protocol = 98
)

// Config is what the plan needs besides the Nodes.
type Config struct {
	NodeName string
	Backend  Backend
	// Family is the pod address family routed: of the podCIDRs and of
	// the host-gw gateways. Zero: NodeIP's.
	Family ipfamily.Family
	// NodeIP is this node's address of Family, invalid when it has none
	// (host-gw is then impossible and every peer goes over VXLAN).
	NodeIP netip.Addr
	// NodeSubnet is the subnet of the interface holding NodeIP; peers
	// inside it are reachable with host-gw.
	NodeSubnet netip.Prefix
	// Iface is the interface holding NodeIP; its MTU is UnderlayMTU.
	Iface       string
	UnderlayMTU int
	// Underlay is the VXLAN source address, of the one family VXLAN runs
	// over on this node; its interface is UnderlayIface. Zero: NodeIP
	// and Iface.
	Underlay      netip.Addr
	UnderlayIface string
	Device        string // VXLAN device name
	VNI           int
	Port          int
}

// vxlanLocal is the VXLAN source address and its interface.
func (c Config) vxlanLocal() (netip.Addr, string) {
	if c.Underlay.IsValid() {
		return c.Underlay, c.UnderlayIface
	}
	return c.NodeIP, c.Iface
}

// Overhead is what VXLAN over an underlay of family f adds to a pod's
// packet: 50 bytes over IPv4, 70 over IPv6.
func Overhead(f ipfamily.Family) int {
	if f == ipfamily.IPv6 {
		return VXLANOverhead + 20
	}
	return VXLANOverhead
}

// overhead is the encapsulation's cost on this node's underlay.
func (c Config) overhead() int {
	local, _ := c.vxlanLocal()
	return Overhead(ipfamily.Of(local))
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch c.Backend {
	case BackendAuto, BackendHostGW, BackendVXLAN:
	default:
		return fmt.Errorf("backend: %q is not auto, host-gw or vxlan", c.Backend)
	}
	if c.NodeIP.IsValid() && c.Family != 0 && !c.Family.Has(c.NodeIP) {
		return fmt.Errorf("node IP: %v is not an %v address", c.NodeIP, c.family())
	}
	if local, _ := c.vxlanLocal(); !local.IsValid() {
		return fmt.Errorf("node IP: none of %v, and no underlay address for VXLAN", c.family())
	}
	if !c.NodeIP.IsValid() && c.Backend == BackendHostGW {
		return fmt.Errorf("backend host-gw: the node has no %v address to route %v pods by (use --backend auto or vxlan)", c.family(), c.family())
	}
	if c.VNI < 1 || c.VNI > 1<<24-1 {
		return fmt.Errorf("vxlan VNI: %d out of range 1-16777215", c.VNI)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("vxlan port: %d out of range 1-65535", c.Port)
	}
	if c.UnderlayMTU < 576+c.overhead() {
		return fmt.Errorf("underlay MTU: %d too small", c.UnderlayMTU)
	}
	return nil
}

// family is the routed family: Family, else NodeIP's.
func (c Config) family() ipfamily.Family {
	if c.Family != 0 {
		return c.Family
	}
	if f := ipfamily.Of(c.NodeIP); f != 0 {
		return f
	}
	if f := ipfamily.Of(c.Underlay); f != 0 {
		return f
	}
	return ipfamily.IPv4
}

// PodMTU is the MTU pods get. With VXLAN possible (auto, vxlan) it leaves
// room for the encapsulation even while every peer is host-gw, because a
// pod's MTU cannot change once it runs and a far peer may join later.
func (c Config) PodMTU() int {
	if c.Backend == BackendHostGW {
		return c.UnderlayMTU
	}
	return c.UnderlayMTU - c.overhead()
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
	Addr     netip.Prefix // own VTEP address, a host prefix
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
	// VTEPMAC is the VTEP MAC the peer published in flannel's
	// annotations; zero: derived from NodeIP (VTEPMAC).
	VTEPMAC [6]byte
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

// VTEPMAC derives a node's VTEP MAC from its underlay address: locally
// administered and unicast. From an IPv4 address, 0e:70 followed by its
// four bytes (unique, and what nodes of earlier releases derive). From an
// IPv6 address, 46 bits of its SHA-256 (the last four bytes alone collide
// for nodes 2^32 apart, as in two /64s of one ULA prefix): the chance that
// two of 5,000 nodes share one is about 2e-7, where 32 bits gave 0.3%;
// the 0x02 bit of the first byte is set and 0x0e/0x70 never both start it,
// so no IPv6-derived MAC equals an IPv4-derived one.
func VTEPMAC(ip netip.Addr) net.HardwareAddr {
	if ip.Is4() {
		b := ip.As4()
		return net.HardwareAddr{0x0e, 0x70, b[0], b[1], b[2], b[3]}
	}
	b := ip.As16()
	h := sha256.Sum256(b[:])
	m := net.HardwareAddr{h[0]&^0x01 | 0x02, h[1], h[2], h[3], h[4], h[5]}
	if m[0] == 0x0e && m[1] == 0x70 {
		m[0] = 0x0a
	}
	return m
}

// VTEPAddr is the VXLAN next hop of a node: its podCIDR's network address.
func VTEPAddr(podCIDR netip.Prefix) netip.Addr { return podCIDR.Masked().Addr() }

// Compute returns the plan for this node given every Node of the cluster.
// It is pure: same input, same plan, sorted. It states the plan in one
// place; the agent keeps it in a Table, which tests check against it.
func Compute(c Config, nodes []*cluster.Node) Plan {
	var p Plan
	if self := find(nodes, c.NodeName); self != nil {
		p.PodCIDR, _ = self.PodCIDR(c.family())
	}
	p.Device = c.device(p.PodCIDR)
	// Two nodes claiming one podCIDR (or two podCIDRs starting at one
	// address, hence one VTEP address): the first by name keeps it, so the
	// kernel never sees two routes or neighbours for one key.
	owner := make(map[netip.Addr]Peer, len(nodes))
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
		peer, skip := c.peerOf(p.PodCIDR, n)
		if skip != "" {
			p.Skipped = append(p.Skipped, skip)
			continue
		}
		key := VTEPAddr(peer.PodCIDR)
		if other, dup := owner[key]; dup {
			p.Skipped = append(p.Skipped, duplicate(peer, other))
			continue
		}
		owner[key] = peer
		p.Peers = append(p.Peers, peer)
		r, nb, f := c.entries(peer)
		p.Routes = append(p.Routes, r)
		if peer.VXLAN {
			p.Neighs = append(p.Neighs, nb)
			p.FDB = append(p.FDB, f)
		}
	}
	return p
}

// device is the VXLAN device the plan wants, nil with host-gw.
func (c Config) device(podCIDR netip.Prefix) *VXLANDevice {
	if c.Backend == BackendHostGW {
		return nil
	}
	local, parent := c.vxlanLocal()
	d := &VXLANDevice{
		Name: c.Device, VNI: c.VNI, Port: c.Port, Local: local, Parent: parent,
		MAC: VTEPMAC(local), MTU: c.UnderlayMTU - c.overhead(), Up: true,
	}
	if podCIDR.IsValid() {
		d.Addr = ipfamily.Host(VTEPAddr(podCIDR))
	}
	return d
}

// peerOf is node n as a peer of this node (whose podCIDR is self), or why
// it cannot be one, judged from n alone.
func (c Config) peerOf(self netip.Prefix, n *cluster.Node) (Peer, string) {
	f := c.family()
	cidr, ok := n.PodCIDR(f)
	if !ok {
		return Peer{}, n.Name + ": no " + f.String() + " podCIDR"
	}
	cidr = cidr.Masked()
	if self.IsValid() && cidr.Overlaps(self) {
		return Peer{}, fmt.Sprintf("%s: podCIDR %s overlaps this node's %s", n.Name, cidr, self)
	}
	if n.Flannel != nil {
		return c.flannelPeer(n, cidr)
	}
	ip, ok := n.InternalIP(f)
	onLink := ok && c.NodeSubnet.IsValid() && c.NodeSubnet.Contains(ip)
	switch {
	case c.Backend == BackendHostGW && !ok:
		return Peer{}, n.Name + ": no " + f.String() + " InternalIP"
	case c.Backend == BackendHostGW && !onLink:
		// The kernel refuses a gateway that is not on a connected
		// subnet; say why instead of failing every sync.
		return Peer{}, fmt.Sprintf("%s: %s is outside %s; host-gw needs one L2 segment (use --backend auto or vxlan)", n.Name, ip, c.NodeSubnet)
	case c.Backend == BackendHostGW, c.Backend == BackendAuto && onLink:
		return Peer{Name: n.Name, NodeIP: ip, PodCIDR: cidr}, ""
	}
	local, _ := c.vxlanLocal()
	uf := ipfamily.Of(local)
	uip, ok := n.InternalIP(uf)
	switch {
	case !ok && uf == f:
		return Peer{}, n.Name + ": no " + f.String() + " InternalIP"
	case !ok:
		return Peer{}, fmt.Sprintf("%s: no %v InternalIP to reach its %v pods over VXLAN (this node's underlay is %v)", n.Name, uf, f, uf)
	}
	return Peer{Name: n.Name, NodeIP: uip, PodCIDR: cidr, VXLAN: true}, ""
}

// duplicate says why peer is skipped for other, which owns its VTEP address.
func duplicate(peer, other Peer) string {
	if peer.PodCIDR == other.PodCIDR {
		return fmt.Sprintf("%s: podCIDR %s already used by %s", peer.Name, peer.PodCIDR, other.Name)
	}
	return fmt.Sprintf("%s: podCIDR %s starts at the address of %s's %s", peer.Name, peer.PodCIDR, other.Name, other.PodCIDR)
}

// entries are the kernel entries reaching peer: its route and, with VXLAN,
// its neighbour and FDB entry (zero otherwise).
func (c Config) entries(peer Peer) (Route, Neigh, FDB) {
	if !peer.VXLAN {
		return Route{Dst: peer.PodCIDR, Gw: peer.NodeIP, Dev: c.Iface}, Neigh{}, FDB{}
	}
	vtep := VTEPAddr(peer.PodCIDR)
	mac := peer.mac()
	return Route{Dst: peer.PodCIDR, Gw: vtep, Dev: c.Device, Onlink: true},
		Neigh{Dev: c.Device, IP: vtep, MAC: mac},
		FDB{Dev: c.Device, MAC: mac, Dst: peer.NodeIP}
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
