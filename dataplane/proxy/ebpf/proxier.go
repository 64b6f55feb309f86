package ebpf

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Config configures ebpf mode.
type Config struct {
	// PinDir holds the pinned maps and links (DefaultPinDir).
	PinDir string
	// Cgroup is the cgroup v2 directory whose processes are served: the
	// cgroup2 root for the whole node.
	Cgroup string
	// NodePortAddresses limits NodePorts to node addresses in these
	// prefixes; empty means every address but loopback.
	NodePortAddresses []netip.Prefix
	// NodeIPs returns the node's InternalIPs, at most one per family, the
	// preferred first (none while unknown): the addresses traffic to
	// externalIPs and load-balancer IPs is SNATed to, by family, and,
	// without Uplinks, how the uplinks are found. nil: unknown.
	NodeIPs func() []netip.Addr
	// Uplinks are the interfaces traffic from outside arrives on; empty:
	// those holding NodeIPs.
	Uplinks []string
	// Bridge is the pod bridge, where replies of local pods are
	// translated back ("cbr0"); attached once it exists.
	Bridge string
	// Overlay is the VXLAN device (routing.DefaultDevice, "podnet.1"),
	// attached once it exists: packets from other nodes' pods arrive
	// there decapsulated, never seen by the uplink's program, and so do
	// the replies of flows SNATed to one of this node's pod-network
	// addresses (a NodePort reached at the cbr0 address) whose backend
	// sits behind VXLAN.
	Overlay string
	Logger  *slog.Logger
}

// Proxier is the ebpf mode proxy.Backend: the attached programs and the
// syncer filling their maps. Nothing is loaded or attached before the
// first Sync.
type Proxier struct {
	cfg    Config
	dp     *Datapath
	syncer *Syncer
	// onCgroup: the socket programs are attached (Attach, once a sync
	// filled the maps).
	onCgroup bool
	// tcMu guards attached and the tc attaching, done by Sync and by
	// the link watch.
	tcMu     sync.Mutex
	attached map[string]int // prog@iface → the ifindex its tc link is on
	watch    *linkWatch
	// held are the UDP destinations that left while still serving
	// (holdServing), whose sockets and flows go once they stop.
	held heldUDP
}

var _ proxy.Backend = (*Proxier)(nil)

// NewProxier returns the backend; it touches nothing until Sync.
func NewProxier(cfg Config) *Proxier {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if cfg.Bridge == "" {
		cfg.Bridge = "cbr0"
	}
	if cfg.Overlay == "" {
		cfg.Overlay = "podnet.1"
	}
	if cfg.NodeIPs == nil {
		cfg.NodeIPs = func() []netip.Addr { return nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Proxier{cfg: cfg, attached: make(map[string]int)}
}

// Sync implements proxy.Backend. The first one loads the programs (see
// Load), programs the maps with a full sync, comparing with what they
// hold (after a restart, entries already right are not rewritten), and
// only then attaches the programs: across an upgrade to a new map layout
// the old programs serve from the old maps until the new ones are full.
func (p *Proxier) Sync(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	if p.dp == nil {
		dp, err := Load(p.cfg.PinDir, p.cfg.Cgroup)
		if err != nil {
			return proxy.SyncResult{}, err
		}
		npa, nodeIPs := p.cfg.NodePortAddresses, p.cfg.NodeIPs
		p.dp, p.syncer = dp, NewSyncer(dp.Maps, func() ([]netip.Addr, error) { return NodeAddrs(npa, nodeIPs()...) })
		full = true
		if p.watch, err = watchLinks(p.linkAppeared); err != nil {
			// Full syncs still attach, only later.
			p.cfg.Logger.Warn("tc programs attach at full syncs only", "err", err)
		}
	}
	res, err := p.syncer.Sync(ports, changed, full)
	if err == nil && !p.onCgroup {
		if err = p.dp.Attach(p.cfg.Cgroup); err != nil {
			return res, err
		}
		p.onCgroup = true
	}
	removed := p.syncer.TakeRemovedUDP()
	flows, sockets := p.syncer.TakeMovedUDP()
	removed, flows, sockets = p.held.hold(newServingUDP(ports), removed, flows, sockets)
	p.expireFlows(removed, flows)
	p.terminate(removed, sockets)
	if err == nil && (full || p.noneAttached()) {
		// The uplink may be unknown and the bridge missing until the node
		// and its first pod exist: retried on every full sync, never
		// failing the socket LB.
		p.attachTC()
	}
	return res, err
}

// expireFlows forgets the flows from outside sent to a UDP endpoint no
// Service uses any more (removed), or that their frontend no longer sends
// to (moved): their next packet picks a backend anew.
func (p *Proxier) expireFlows(removed []netip.AddrPort, moved []FlowTarget) {
	targets := moved
	for _, ap := range removed {
		targets = append(targets, FlowTarget{Backend: ap})
	}
	if len(targets) == 0 {
		return
	}
	flows, aff, err := p.dp.Flows().Expire(targets)
	if err != nil {
		p.cfg.Logger.Warn("expire flows to moved UDP endpoints", "targets", len(targets), "err", err)
	}
	p.cfg.Logger.Debug("expired flows to moved UDP endpoints", "targets", len(targets), "flows", flows, "affinity", aff)
}

// terminate destroys the connected UDP sockets socket LB pinned to an
// endpoint no Service uses any more (removed), or that their frontend no
// longer sends to (moved): their owners hear of it and dial again.
func (p *Proxier) terminate(removed []netip.AddrPort, moved []FlowTarget) {
	targets := moved
	for _, ap := range removed {
		targets = append(targets, FlowTarget{Backend: ap})
	}
	if len(targets) == 0 {
		return
	}
	if n, err := p.dp.Terminate(targets, p.cfg.Cgroup); err != nil {
		p.cfg.Logger.Warn("destroy UDP sockets connected to destinations that left", "targets", targets, "namespaces", n, "err", err)
	} else {
		p.cfg.Logger.Debug("destroyed UDP sockets connected to destinations that left", "targets", targets, "namespaces", n)
	}
}

// attachTC puts the tc programs on the uplinks, the bridge and the
// overlay where they are not yet, nor since the interface was made anew
// (the overlay is, when its VXLAN settings change).
func (p *Proxier) attachTC() {
	p.tcMu.Lock()
	defer p.tcMu.Unlock()
	want := map[string]string{p.cfg.Bridge: TCNodePort, p.cfg.Overlay: TCNodePort}
	uplinks := p.cfg.Uplinks
	if len(uplinks) == 0 {
		if ifcs, err := link.Interfaces(); err == nil {
			for _, ip := range p.cfg.NodeIPs() {
				if ifc, _, ok := link.Holding(ifcs, "", ip); ok {
					uplinks = append(uplinks, ifc.Name)
				}
			}
		}
	}
	for _, u := range uplinks {
		want[u] = TCNodePort
	}
	for iface, prog := range want {
		id := prog + "@" + iface
		ifc, err := net.InterfaceByName(iface)
		if err != nil || p.attached[id] == ifc.Index {
			continue
		}
		if err := p.dp.AttachTC(prog, iface); err != nil {
			p.cfg.Logger.Warn("attach tc program; traffic from outside is not served there", "iface", iface, "err", err)
			continue
		}
		p.cfg.Logger.Info("tc program attached", "program", prog, "iface", iface)
		p.attached[id] = ifc.Index
	}
}

// linkAppeared attaches the tc programs when name is an interface they
// belong on by name (the uplink found by its address is there from the
// start; a full sync catches it up).
func (p *Proxier) linkAppeared(name string) {
	if name == p.cfg.Bridge || name == p.cfg.Overlay || slices.Contains(p.cfg.Uplinks, name) {
		p.attachTC()
	}
}

func (p *Proxier) noneAttached() bool {
	p.tcMu.Lock()
	defer p.tcMu.Unlock()
	return len(p.attached) == 0
}

// Close releases the process's handles; programs stay attached and keep
// serving what the maps hold.
func (p *Proxier) Close() error {
	if p.watch != nil {
		p.watch.stop()
		p.watch = nil
	}
	if p.dp == nil {
		return nil
	}
	return p.dp.Close()
}

// NodeAddrs lists this network namespace's addresses within prefixes (all
// when empty), without loopback and link-local ones: where NodePorts
// answer, as in iptables mode. primary, those the node holds, come first
// in their order (the first of each family is its SNAT address); the rest
// are sorted.
func NodeAddrs(prefixes []netip.Prefix, primary ...netip.Addr) ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		if len(prefixes) > 0 && !containsAny(prefixes, ip) {
			continue
		}
		out = append(out, ip)
	}
	return primaryFirst(sortedAddrs(out), primary), nil
}

// primaryFirst moves those of primary that addrs holds to its front, in
// their order.
func primaryFirst(addrs, primary []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, p := range primary {
		if p = p.Unmap(); slices.Contains(addrs, p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, a := range addrs {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
