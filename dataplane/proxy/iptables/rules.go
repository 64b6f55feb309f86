// Package iptables is the iptables backend of the Service proxy: it turns
// proxy.ServicePorts into iptables rules and applies them with one
// iptables-restore --noflush transaction per sync.
//
// The layout differs from kube-proxy's where kube-proxy is slow:
//
//   - Dispatch is a prefix tree, not a list. PODSVC-SERVICES and the
//     PODSVC-D-<prefix> chains below it split the cluster IPs 4 bits at a
//     time, so a first packet meets at most 16 rules per level and
//     ~log16(n) levels, then a leaf of at most 16 Service ports. External
//     and load-balancer IPs have a tree of their own (PODSVC-X-<prefix>).
//   - Masquerading traffic to cluster IPs from outside the cluster CIDR
//     takes one rule per leaf, not one per Service: the leaf marks, and
//     POSTROUTING masquerades marked packets that were DNATed.
//   - No chain per endpoint. A ClusterIP-only port's endpoints are DNAT rules
//     with -m statistic right in its leaf; ports with external entry points
//     or Local traffic policies get a few chains of their own (PODSVC-S-,
//     -L-, -E-, -F-). 10,000 ClusterIP Services × 10 endpoints make ~800
//     chains, not ~110,000: for every rule, iptables-nft-restore searches
//     the chains its input declares one by one, in name order. (A chain per
//     Service port with the endpoint rules stripped of the frontend's
//     matches, written in transactions of a few hundred chains, syncs
//     10,000 Services with ~20 % less CPU, but every later commit costs
//     the nft kernel more: it re-validates every rule and chain reachable
//     from the nat hooks. BENCHMARKS.md has the figures.)
//   - The jumps from the built-in chains are kept first in their chains and
//     fixed inside the restore transaction, not by separate commands (with
//     iptables-legacy each command rereads the whole table).
//   - Session affinity uses -m recent on the DNAT rules themselves.
//   - No endpoints → the nat rule sets a mark and one filter rule rejects it,
//     instead of one filter rule per Service.
//   - Hairpin masquerade is one POSTROUTING rule per local endpoint address
//     (source == destination after DNAT), not a rule in every endpoint chain.
//
// Rules are computed by Generate, a pure function of the config and the
// ServicePorts (Generator memoizes it per ServicePort and keeps the tree
// while no frontend address comes or goes); a partial sync rewrites only the
// chains whose text changed. iptablestest holds a fake iptables that fails
// like the kernel and a packet tracer.
package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Chain names. Every chain the proxy creates starts with ChainPrefix.
const (
	ChainPrefix      = "PODSVC-"
	ChainServices    = "PODSVC-SERVICES"
	ChainNodePorts   = "PODSVC-NODEPORTS"
	ChainPostrouting = "PODSVC-POSTROUTING"
	ChainFilter      = "PODSVC-FILTER"
	ChainForward     = "PODSVC-FORWARD"
)

// Packet marks. Masquerade is what kube-proxy uses; reject and drop ask the
// filter table to refuse a packet the nat table could not send anywhere.
const (
	MarkMasq   = 0x4000
	MarkReject = 0x8000
	MarkDrop   = 0x10000
)

// Config is what rule generation needs besides the ServicePorts.
type Config struct {
	// Family is the address family of the rules (iptables or ip6tables);
	// zero: the family of ClusterCIDR, else IPv4. Ports of another family
	// are not this generator's.
	Family ipfamily.Family
	// ClusterCIDR is the pod network; traffic to a cluster IP from outside
	// it is masqueraded. Invalid: only MasqueradeAll masquerades.
	ClusterCIDR netip.Prefix
	// NodePortAddresses limits NodePorts to local addresses in these
	// prefixes; empty means every local address.
	NodePortAddresses []netip.Prefix
	MasqueradeAll     bool
}

// Jump is a rule in a built-in chain that leads into the proxy's chains.
type Jump struct {
	Table, Chain string
	Args         []string
}

// JumpComment marks the proxy's rules in built-in chains.
const JumpComment = "podnet service proxy"

// Jumps are the proxy's rules in built-in chains, kept outside the restore
// transactions as the first rules of their chains, in this order.
var Jumps = []Jump{
	{"nat", "PREROUTING", jumpArgs(ChainServices)},
	{"nat", "OUTPUT", jumpArgs(ChainServices)},
	{"nat", "POSTROUTING", jumpArgs(ChainPostrouting)},
	{"filter", "INPUT", jumpArgs(ChainFilter)},
	{"filter", "FORWARD", jumpArgs(ChainFilter)},
	{"filter", "FORWARD", jumpArgs(ChainForward)},
	{"filter", "OUTPUT", jumpArgs(ChainFilter)},
}

func jumpArgs(chain string) []string {
	return []string{"-m", "comment", "--comment", JumpComment, "-j", chain}
}

// Ruleset is the proxy's chains, by table then chain name; a chain's rules
// are the arguments after "-A CHAIN".
type Ruleset map[string]map[string][]string

// Count returns the number of rules in table.
func (r Ruleset) Count(table string) int {
	n := 0
	for _, rules := range r[table] {
		n += len(rules)
	}
	return n
}

// Generate computes the complete Ruleset for ports.
func Generate(cfg Config, ports map[cluster.Key][]*proxy.ServicePort) Ruleset {
	return NewGenerator(cfg).Generate(ports)
}

// Generator memoizes the rules of each ServicePort by identity, so a sync
// after a small change only formats the rules of the Services that changed;
// when no frontend address came or went, it also keeps the dispatch tree and
// rewrites only the chains holding the changed ports.
type Generator struct {
	cfg   Config
	cache map[*proxy.ServicePort]*portRules

	// From the last Generate: its input (a copy), its keys in order, its
	// nat chains, and the tree's chains as parts with where each frontend
	// went.
	lastPorts map[cluster.Key][]*proxy.ServicePort
	lastKeys  []cluster.Key
	lastNat   map[string][]string
	parts     map[string][]part
	chainOf   map[frontRef]string
}

// NewGenerator returns a Generator for cfg.
func NewGenerator(cfg Config) *Generator {
	if cfg.Family == 0 {
		cfg.Family = ipfamily.OfPrefix(cfg.ClusterCIDR)
	}
	if cfg.Family == 0 {
		cfg.Family = ipfamily.IPv4
	}
	return &Generator{cfg: cfg, cache: make(map[*proxy.ServicePort]*portRules)}
}

// portRules is what one ServicePort contributes.
type portRules struct {
	clusterFronts  []frontend          // entries for the cluster IP tree
	externalFronts []frontend          // entries for the external IP tree
	nodePorts      []string            // rules in PODSVC-NODEPORTS
	chains         map[string][]string // its own nat chains
	hairpin        []netip.Addr        // local endpoint addresses
}

// frontend is the rules matching one destination address.
type frontend struct {
	addr  netip.Addr
	rules []string
	ref   frontRef
}

// frontRef names a frontend independently of the ServicePort's identity.
type frontRef struct {
	service  cluster.Key
	port     proxy.PortName
	external bool
	index    int
}

// part is a piece of a tree chain: fixed lines or a frontend's rules.
type part struct {
	lines []string
	front *frontRef
}

// Generate computes the complete Ruleset for ports.
func (g *Generator) Generate(ports map[cluster.Key][]*proxy.ServicePort) Ruleset {
	nat, ok := g.incremental(ports)
	if !ok {
		nat = g.full(ports)
	}
	g.lastPorts = maps.Clone(ports)
	g.lastNat = nat

	var nodePorts []string
	hairpin := make(map[netip.Addr]bool)
	for _, k := range g.lastKeys {
		for _, sp := range ports[k] {
			pr := g.cache[sp]
			nodePorts = append(nodePorts, pr.nodePorts...)
			for _, a := range pr.hairpin {
				hairpin[a] = true
			}
		}
	}
	nat[ChainNodePorts] = nodePorts
	var post []string
	hp := make([]netip.Addr, 0, len(hairpin))
	for a := range hairpin {
		hp = append(hp, a)
	}
	slices.SortFunc(hp, netip.Addr.Compare)
	for _, a := range hp {
		post = append(post, fmt.Sprintf("-s %s -d %s -j MASQUERADE", ipfamily.Host(a), ipfamily.Host(a)))
	}
	post = append(post,
		fmt.Sprintf("-m mark ! --mark %#x/%#x -j RETURN", MarkMasq, MarkMasq),
		fmt.Sprintf("-j MARK --xor-mark %#x", MarkMasq),
		"-m conntrack --ctstate DNAT -j MASQUERADE --random-fully")
	nat[ChainPostrouting] = post

	filter := map[string][]string{
		ChainFilter: {
			fmt.Sprintf("-m mark --mark %#x/%#x -j REJECT", MarkReject, MarkReject),
			fmt.Sprintf("-m mark --mark %#x/%#x -j DROP", MarkDrop, MarkDrop),
		},
		ChainForward: {
			fmt.Sprintf("-m mark --mark %#x/%#x -j ACCEPT", MarkMasq, MarkMasq),
			"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		},
	}
	return Ruleset{"nat": nat, "filter": filter}
}

// full builds every nat chain but PODSVC-NODEPORTS and PODSVC-POSTROUTING.
func (g *Generator) full(ports map[cluster.Key][]*proxy.ServicePort) map[string][]string {
	keys := make([]cluster.Key, 0, len(ports))
	for k := range ports {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cluster.Key) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	g.lastKeys = keys

	nat := make(map[string][]string)
	cache := make(map[*proxy.ServicePort]*portRules, len(g.cache))
	var fronts, extFronts []frontend
	for _, k := range keys {
		for _, sp := range ports[k] {
			pr := g.cache[sp]
			if pr == nil {
				pr = g.portRules(k, sp)
			}
			cache[sp] = pr
			fronts = append(fronts, pr.clusterFronts...)
			extFronts = append(extFronts, pr.externalFronts...)
			for name, rules := range pr.chains {
				nat[name] = rules
			}
		}
	}
	g.cache = cache

	g.parts = make(map[string][]part)
	g.chainOf = make(map[frontRef]string, len(fronts)+len(extFronts))
	var services []part
	for _, tr := range []struct {
		fronts []frontend
		name   string
		head   func(netip.Prefix) []string
	}{{fronts, "PODSVC-D-", g.leafHead}, {extFronts, "PODSVC-X-", nil}} {
		if len(tr.fronts) == 0 {
			continue
		}
		sort.SliceStable(tr.fronts, func(i, j int) bool { return tr.fronts[i].addr.Less(tr.fronts[j].addr) })
		t := tree{parts: g.parts, name: tr.name, head: tr.head, width: g.cfg.Family.Bits()}
		services = append(services, t.build(tr.fronts, commonPrefix(tr.fronts))...)
	}
	g.parts[ChainServices] = append(services, part{lines: g.nodePortJumps()})
	for name, parts := range g.parts {
		for _, pt := range parts {
			if pt.front != nil {
				g.chainOf[*pt.front] = name
			}
		}
		nat[name] = g.materialize(parts, ports)
	}
	return nat
}

// incremental updates the last nat chains when only rules changed, not
// which frontends exist; ok is false when a full build is needed.
func (g *Generator) incremental(ports map[cluster.Key][]*proxy.ServicePort) (map[string][]string, bool) {
	if g.lastNat == nil || len(ports) != len(g.lastPorts) {
		return nil, false
	}
	type change struct{ old, new []*proxy.ServicePort }
	var changes []change
	for k, sps := range ports {
		old, had := g.lastPorts[k]
		if !had || len(old) != len(sps) {
			return nil, false
		}
		if slices.Equal(old, sps) {
			continue
		}
		for i := range sps {
			if old[i] != sps[i] && !sameFrontends(g.cache[old[i]], g.portRulesCached(k, sps[i])) {
				return nil, false
			}
		}
		changes = append(changes, change{old, sps})
	}
	nat := maps.Clone(g.lastNat)
	dirty := make(map[string]bool)
	for _, c := range changes {
		for i, sp := range c.new {
			if c.old[i] == sp {
				continue
			}
			for name := range g.cache[c.old[i]].chains {
				delete(nat, name)
			}
			delete(g.cache, c.old[i])
			pr := g.cache[sp]
			for name, rules := range pr.chains {
				nat[name] = rules
			}
			for _, f := range append(slices.Clone(pr.clusterFronts), pr.externalFronts...) {
				dirty[g.chainOf[f.ref]] = true
			}
		}
	}
	for name := range dirty {
		nat[name] = g.materialize(g.parts[name], ports)
	}
	return nat, true
}

// portRulesCached returns the memoized rules of sp, computing them once.
func (g *Generator) portRulesCached(k cluster.Key, sp *proxy.ServicePort) *portRules {
	pr := g.cache[sp]
	if pr == nil {
		pr = g.portRules(k, sp)
		g.cache[sp] = pr
	}
	return pr
}

func sameFrontends(a, b *portRules) bool {
	if a == nil || b == nil || len(a.clusterFronts) != len(b.clusterFronts) || len(a.externalFronts) != len(b.externalFronts) {
		return false
	}
	for i := range a.clusterFronts {
		if a.clusterFronts[i].addr != b.clusterFronts[i].addr || a.clusterFronts[i].ref != b.clusterFronts[i].ref {
			return false
		}
	}
	for i := range a.externalFronts {
		if a.externalFronts[i].addr != b.externalFronts[i].addr || a.externalFronts[i].ref != b.externalFronts[i].ref {
			return false
		}
	}
	return true
}

// materialize turns a tree chain's parts into rules, with each frontend's
// current rules.
func (g *Generator) materialize(parts []part, ports map[cluster.Key][]*proxy.ServicePort) []string {
	var out []string
	for _, pt := range parts {
		if pt.front == nil {
			out = append(out, pt.lines...)
			continue
		}
		r := pt.front
		for _, sp := range ports[r.service] {
			if sp.Name != r.port {
				continue
			}
			pr := g.cache[sp]
			if r.external {
				out = append(out, pr.externalFronts[r.index].rules...)
			} else {
				out = append(out, pr.clusterFronts[r.index].rules...)
			}
		}
	}
	return out
}

func (g *Generator) nodePortJumps() []string {
	if len(g.cfg.NodePortAddresses) == 0 {
		// Not on loopback: DNAT from 127.0.0.1 to a pod needs route_localnet
		// and would otherwise be dropped as martian (IPv6 never routes
		// from ::1).
		return []string{fmt.Sprintf("! -d %s -m addrtype --dst-type LOCAL -j %s", g.cfg.Family.Loopback(), ChainNodePorts)}
	}
	var out []string
	for _, p := range g.cfg.NodePortAddresses {
		if g.cfg.Family.HasPrefix(p) {
			out = append(out, fmt.Sprintf("-d %s -m addrtype --dst-type LOCAL -j %s", p.Masked(), ChainNodePorts))
		}
	}
	return out
}

const markFmt = "-j MARK --or-mark %#x"

// portRules builds one ServicePort's rules: its own chains, the cluster IP
// part, and for a Service reachable from outside the external and firewall
// parts.
func (g *Generator) portRules(key cluster.Key, sp *proxy.ServicePort) *portRules {
	h := portHash(sp.Name)
	c := portCtx{key: key, sp: sp, proto: protoMatch(sp.Protocol), hash: h,
		svcChain: "PODSVC-S-" + h, localChain: "PODSVC-L-" + h,
		own: sp.External() || sp.InternalPolicyLocal}
	pr := &portRules{chains: make(map[string][]string)}
	if c.own {
		if len(sp.ClusterEndpoints) > 0 {
			pr.chains[c.svcChain] = endpointRules(nil, "-p "+strings.ToLower(string(sp.Protocol)), sp, sp.ClusterEndpoints)
		}
		if len(sp.LocalEndpoints) > 0 {
			pr.chains[c.localChain] = endpointRules(nil, "-p "+strings.ToLower(string(sp.Protocol)), sp, sp.LocalEndpoints)
		}
	}
	c.clusterIPRules(pr)
	if sp.External() {
		g.externalRules(c, pr)
	}
	return pr
}

// portCtx is what every part of one ServicePort's rules shares.
type portCtx struct {
	key   cluster.Key
	sp    *proxy.ServicePort
	proto string // protoMatch of the port's protocol
	hash  string // of the port's name, in its chains' names
	// The port's chains: all endpoints, local endpoints, and (set by
	// externalRules, only a Service reachable from outside has one) the
	// external entry.
	svcChain, localChain, extChain string
	// own: the port has endpoint chains of its own (else the cluster IP's
	// rules DNAT directly, saving a jump on the common path).
	own bool
}

// match is the match of traffic to addr on the port.
func (c portCtx) match(addr netip.Addr) string {
	return fmt.Sprintf("-d %s %s --dport %d", ipfamily.Host(addr), c.proto, c.sp.Port)
}

// target is where traffic for eps goes: their chain, or a mark that
// rejects (the Service has no endpoints at all) or drops (none of these).
func (c portCtx) target(eps []proxy.Endpoint, chain string) string {
	switch {
	case !c.sp.HasEndpoints:
		return fmt.Sprintf(markFmt, MarkReject)
	case len(eps) == 0:
		return fmt.Sprintf(markFmt, MarkDrop)
	}
	return "-j " + chain
}

// clusterIPRules adds the cluster IP's frontend; the leaf it lands in marks
// it for masquerading.
func (c portCtx) clusterIPRules(pr *portRules) {
	sp := c.sp
	m := c.match(sp.ClusterIP)
	var rules []string
	internal, internalChain := sp.ClusterEndpoints, c.svcChain
	if sp.InternalPolicyLocal {
		internal, internalChain = sp.LocalEndpoints, c.localChain
	}
	if c.own || !sp.HasEndpoints || len(internal) == 0 {
		rules = append(rules, m+" "+c.target(internal, internalChain))
	} else {
		rules = endpointRules(rules, m, sp, internal)
	}
	pr.clusterFronts = append(pr.clusterFronts, frontend{sp.ClusterIP, rules, frontRef{c.key, sp.Name, false, 0}})
	for _, e := range internal {
		if e.Local {
			pr.hairpin = append(pr.hairpin, e.Addr())
		}
	}
}

// externalRules adds the external entry points: the external chain, the
// frontends of externalIPs and load-balancer IPs (behind the firewall
// chain when source ranges are set) and the NodePort rule.
func (g *Generator) externalRules(c portCtx, pr *portRules) {
	sp := c.sp
	c.extChain = "PODSVC-E-" + c.hash
	pr.chains[c.extChain] = g.externalChain(c)
	for _, e := range sp.ExternalEndpoints() {
		if e.Local {
			pr.hairpin = append(pr.hairpin, e.Addr())
		}
	}
	for _, ip := range sp.ExternalIPs {
		pr.externalFronts = append(pr.externalFronts, frontend{ip, []string{c.match(ip) + " -j " + c.extChain},
			frontRef{c.key, sp.Name, true, len(pr.externalFronts)}})
	}
	lbTarget := c.firewallRules(pr)
	for _, ip := range sp.LoadBalancerIPs {
		pr.externalFronts = append(pr.externalFronts, frontend{ip, []string{c.match(ip) + " -j " + lbTarget},
			frontRef{c.key, sp.Name, true, len(pr.externalFronts)}})
	}
	if sp.NodePort != 0 {
		pr.nodePorts = []string{fmt.Sprintf("%s --dport %d -j %s", c.proto, sp.NodePort, c.extChain)}
	}
}

// externalChain is the rules of the external entry chain, by traffic
// policy.
func (g *Generator) externalChain(c portCtx) []string {
	sp := c.sp
	switch {
	case !sp.HasEndpoints:
		return []string{fmt.Sprintf(markFmt, MarkReject)}
	case sp.ExternalPolicyLocal:
		// Pods and the node itself may use any endpoint (and the node's
		// own traffic is masqueraded); other clients keep their source
		// address and reach local endpoints only.
		clusterTarget := c.target(sp.ClusterEndpoints, c.svcChain)
		if len(sp.ClusterEndpoints) == 0 {
			clusterTarget = c.target(sp.LocalEndpoints, c.localChain)
		}
		var ext []string
		if g.cfg.ClusterCIDR.IsValid() {
			ext = append(ext, fmt.Sprintf("-s %s %s", g.cfg.ClusterCIDR.Masked(), clusterTarget))
		}
		return append(ext,
			"-m addrtype --src-type LOCAL "+fmt.Sprintf(markFmt, MarkMasq),
			"-m addrtype --src-type LOCAL "+clusterTarget,
			fmt.Sprintf("-j MARK --and-mark %#x", ^uint32(MarkMasq)),
			c.target(sp.LocalEndpoints, c.localChain))
	default:
		return []string{fmt.Sprintf(markFmt, MarkMasq), c.target(sp.ClusterEndpoints, c.svcChain)}
	}
}

// firewallRules adds the firewall chain of load-balancer IPs with source
// ranges (allowed sources go on to the external chain, the rest is
// dropped) and returns where the load-balancer frontends jump.
func (c portCtx) firewallRules(pr *portRules) string {
	sp := c.sp
	if len(sp.LoadBalancerIPs) == 0 || len(sp.LoadBalancerSourceRanges) == 0 {
		return c.extChain
	}
	var fw []string
	for _, r := range sp.LoadBalancerSourceRanges {
		if sp.Family().HasPrefix(r) {
			fw = append(fw, fmt.Sprintf("-s %s -j %s", r.Masked(), c.extChain))
		}
	}
	fwChain := "PODSVC-F-" + c.hash
	pr.chains[fwChain] = append(fw, fmt.Sprintf(markFmt, MarkDrop))
	return fwChain
}

// endpointRules appends the DNAT rules choosing one of eps evenly at random
// (rule i matches with probability 1/(n-i)); with session affinity, a
// client seen within the timeout returns to its endpoint first.
func endpointRules(rules []string, match string, sp *proxy.ServicePort, eps []proxy.Endpoint) []string {
	affinity := int(sp.AffinityTimeout.Seconds())
	recent := func(e proxy.Endpoint) string {
		return "PODSVC-" + hash(sp.Name.String()+"|"+e.AddrPort().String())
	}
	if affinity > 0 {
		for _, e := range eps {
			rules = append(rules, fmt.Sprintf("%s -m recent --name %s --rcheck --seconds %d --reap -m recent --name %s --set -j DNAT --to-destination %s",
				match, recent(e), affinity, recent(e), e.AddrPort()))
		}
	}
	for i, e := range eps {
		var b strings.Builder
		b.Grow(len(match) + 128)
		b.WriteString(match)
		if n := len(eps) - i; n > 1 {
			b.WriteString(" -m statistic --mode random --probability ")
			b.WriteString(strconv.FormatFloat(1/float64(n), 'f', 10, 64))
		}
		if affinity > 0 {
			b.WriteString(" -m recent --name " + recent(e) + " --set")
		}
		b.WriteString(" -j DNAT --to-destination ")
		b.WriteString(e.AddrPort().String())
		rules = append(rules, b.String())
	}
	return rules
}

func protoMatch(p cluster.Protocol) string {
	l := strings.ToLower(string(p))
	return "-p " + l + " -m " + l
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:])[:16]
}

func portHash(n proxy.PortName) string { return hash(n.String()) }

const (
	leafMax = 16 // Service ports in a leaf chain
	fanBits = 4  // address bits split per tree level
)

// leafHead is the rule at the top of every cluster IP leaf: traffic to a
// cluster IP from outside the cluster CIDR (or any, with MasqueradeAll) is
// marked for masquerading.
func (g *Generator) leafHead(p netip.Prefix) []string {
	switch {
	case g.cfg.MasqueradeAll:
		return []string{fmt.Sprintf("-d %s %s", p, fmt.Sprintf(markFmt, MarkMasq))}
	case g.cfg.ClusterCIDR.IsValid():
		return []string{fmt.Sprintf("-d %s ! -s %s %s", p, g.cfg.ClusterCIDR.Masked(), fmt.Sprintf(markFmt, MarkMasq))}
	}
	return nil
}

// tree builds a dispatch tree of chains named name+<prefix>, over
// addresses width bits wide (32 or 128).
type tree struct {
	parts map[string][]part
	name  string
	head  func(netip.Prefix) []string // rules opening each leaf; may be nil
	width int
}

func (t tree) leaf(fronts []frontend, p netip.Prefix) []part {
	var out []part
	if t.head != nil {
		out = append(out, part{lines: t.head(p)})
	}
	for i := range fronts {
		out = append(out, part{front: &fronts[i].ref})
	}
	return out
}

// build returns the parts of the node for fronts (sorted by address, all
// within p), adding the chains below it.
func (t tree) build(fronts []frontend, p netip.Prefix) []part {
	if len(fronts) <= leafMax || fronts[0].addr == fronts[len(fronts)-1].addr {
		return t.leaf(fronts, p)
	}
	// Split into about len/leafMax children (at most 16): leaves end up
	// nearly full instead of a dense range splitting into tiny ones.
	common := p.Bits()
	bits := 1
	for bits < fanBits && len(fronts) > leafMax<<bits {
		bits++
	}
	bits = min(bits, t.width-common)
	var out []part
	for i := 0; i < len(fronts); {
		key := ipfamily.BitsAt(fronts[i].addr, common, bits)
		j := i
		for j < len(fronts) && ipfamily.BitsAt(fronts[j].addr, common, bits) == key {
			j++
		}
		group := fronts[i:j]
		if group[0].addr == group[len(group)-1].addr && len(group) <= 2 {
			// One address: its rules go inline, no chain.
			out = append(out, t.leaf(group, ipfamily.Host(group[0].addr))...)
		} else {
			sub := commonPrefix(group)
			name := t.chainName(sub)
			t.parts[name] = t.build(group, sub)
			out = append(out, part{lines: []string{fmt.Sprintf("-d %s -j %s", sub, name)}})
		}
		i = j
	}
	return out
}

// chainName names the tree chain of prefix p: the address in hex and the
// length for IPv4 ("PODSVC-D-0A600000-20"); for IPv6, whose 32 hex digits
// would pass iptables' 28-character limit, a hash of the prefix.
func (t tree) chainName(p netip.Prefix) string {
	if t.width == 32 {
		return fmt.Sprintf("%s%08X-%d", t.name, ipfamily.BitsAt(p.Addr(), 0, 32), p.Bits())
	}
	return t.name + hash(p.String())
}

// commonPrefix is the longest prefix holding every address of fronts
// (sorted).
func commonPrefix(fronts []frontend) netip.Prefix {
	lo, hi := fronts[0].addr, fronts[len(fronts)-1].addr
	common := 0
	for common < lo.BitLen() && ipfamily.BitsAt(lo, common, 1) == ipfamily.BitsAt(hi, common, 1) {
		common++
	}
	return netip.PrefixFrom(lo, common).Masked()
}
