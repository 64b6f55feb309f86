package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Program is the desired state of the node's policy table as data: for every
// policy that selects a local pod, which local pods it selects per direction
// and, per rule, its peers and ports. Addresses of both families are mixed;
// the nftables applier splits them into one set per family.
type Program struct {
	Policies []*PolicyProgram // by key
}

// PolicyProgram is one NetworkPolicy for this node.
type PolicyProgram struct {
	Key cluster.Key
	Dir [2]DirProgram // by Direction
}

// DirProgram is a policy's ingress or egress half.
type DirProgram struct {
	Applies bool
	// Selected are the local pods' addresses the policy selects, sorted.
	Selected []netip.Addr
	Rules    []RuleProgram
}

// RuleProgram is one rule: a peer that matches and a port that matches.
type RuleProgram struct {
	AnyPeer     bool
	HasPodPeers bool
	// PeerKey names the rule's pod peers (PeerKey); rules with one key
	// hold equal Pods, which the table keeps in one set.
	PeerKey string
	// Pods are the addresses of the pods the rule's selectors pick, in
	// any namespace, sorted.
	Pods []netip.Addr
	// Blocks are the ipBlocks less their excepts, sorted and disjoint.
	Blocks  []AddrRange
	AnyPort bool
	Ports   []PortRange
	// HasNamed is true when the rule names ports; Named are the
	// destination pods' (address, protocol, port) they resolve to.
	HasNamed bool
	Named    []NamedTarget
}

// AddrRange is an inclusive range of addresses of one family.
type AddrRange struct{ From, To netip.Addr }

// PortRange is one numeric ports entry; From 0 means every port.
type PortRange struct {
	Protocol cluster.Protocol
	From, To uint16
}

// NamedTarget is a named port resolved at one destination address.
type NamedTarget struct {
	Addr     netip.Addr
	Protocol cluster.Protocol
	Port     uint16
}

// shape is what decides a policy's nftables rules (as against the elements
// of its sets): a change of shape replaces the policy's rules, anything else
// is an element update.
func (p *PolicyProgram) shape() string {
	var b strings.Builder
	for d, dir := range p.Dir {
		fmt.Fprintf(&b, "%d:%v[", d, dir.Applies)
		for _, r := range dir.Rules {
			fmt.Fprintf(&b, "{%v %v %q %v %v %v %v}", r.AnyPeer, r.HasPodPeers, r.PeerKey, r.Blocks, r.AnyPort, r.Ports, r.HasNamed)
		}
		b.WriteString("]")
	}
	return b.String()
}

// Compile builds the Program for the pods that local says live on this node.
// Policies selecting no local pod are left out: other nodes enforce them.
func (m *Model) Compile(local func(*cluster.Pod) bool) *Program {
	prog := &Program{}
	var namespaces []string
	for ns := range m.policies {
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	res := m.newResolver()
	for _, ns := range namespaces {
		for _, np := range m.policies[ns] {
			if pp := res.compilePolicy(np, local); pp != nil {
				prog.Policies = append(prog.Policies, pp)
			}
		}
	}
	return prog
}

// resolver compiles policies over one state of the model, resolving each
// distinct pod peer (and egress named ports) once: in the benchmark's world
// 900 ingress rules name one of 10 peers. Rules with one PeerKey share one
// Pods slice.
type resolver struct {
	m     *Model
	peers map[string][]netip.Addr
	named map[string][]NamedTarget
}

func (m *Model) newResolver() *resolver {
	return &resolver{m: m, peers: make(map[string][]netip.Addr), named: make(map[string][]NamedTarget)}
}

// compilePolicy is one policy's program, nil when it selects no local pod.
func (m *Model) compilePolicy(np *cluster.NetworkPolicy, local func(*cluster.Pod) bool) *PolicyProgram {
	return m.newResolver().compilePolicy(np, local)
}

func (res *resolver) compilePolicy(np *cluster.NetworkPolicy, local func(*cluster.Pod) bool) *PolicyProgram {
	m := res.m
	var selected []netip.Addr
	for _, p := range m.byNS[np.Namespace] {
		if local(p) && Selects(np, p) {
			m.owned(p, func(a netip.Addr) { selected = append(selected, a) })
		}
	}
	if len(selected) == 0 {
		return nil
	}
	sortAddrs(selected)
	pp := &PolicyProgram{Key: np.Key()}
	for _, d := range []Direction{Ingress, Egress} {
		if !applies(np, d) {
			continue
		}
		dir := &pp.Dir[d]
		dir.Applies, dir.Selected = true, selected
		for _, r := range rules(np, d) {
			dir.Rules = append(dir.Rules, res.compileRule(np, r, d, selected))
		}
	}
	return pp
}

func (res *resolver) compileRule(np *cluster.NetworkPolicy, r cluster.PolicyRule, d Direction, selected []netip.Addr) RuleProgram {
	m := res.m
	rp := RuleProgram{AnyPeer: len(r.Peers) == 0, AnyPort: len(r.Ports) == 0}
	for _, peer := range r.Peers {
		if peer.IsBlock() {
			rp.Blocks = append(rp.Blocks, blockRanges(peer)...)
			continue
		}
		rp.HasPodPeers = true
	}
	if rp.HasPodPeers {
		rp.PeerKey = PeerKey(np, r)
		pods, ok := res.peers[rp.PeerKey]
		if !ok {
			pods = m.podPeers(np, r)
			res.peers[rp.PeerKey] = pods
		}
		rp.Pods = pods
	}
	rp.Blocks = mergeRanges(rp.Blocks)
	for _, pp := range r.Ports {
		if pp.Named == "" {
			rp.Ports = append(rp.Ports, PortRange{Protocol: pp.Protocol, From: pp.Port, To: pp.EndPort})
			continue
		}
		rp.HasNamed = true
	}
	if !rp.HasNamed {
		return rp
	}
	// Named ports resolve at the destination: the selected pods for
	// ingress, any pod for egress (the same for every egress rule naming
	// the same ports).
	if d == Ingress {
		for _, a := range selected {
			rp.Named = append(rp.Named, m.namedAt(r, a)...)
		}
		rp.Named = sortNamed(rp.Named)
		return rp
	}
	k := namedKey(r)
	named, ok := res.named[k]
	if !ok {
		named = m.namedAnywhere(r)
		res.named[k] = named
	}
	rp.Named = named
	return rp
}

// podPeers are the addresses of the pods r's pod peers (not ipBlocks)
// take, sorted: per peer, the pods of the namespaces it picks.
func (m *Model) podPeers(np *cluster.NetworkPolicy, r cluster.PolicyRule) []netip.Addr {
	var out []netip.Addr
	for _, peer := range r.Peers {
		if peer.IsBlock() {
			continue
		}
		take := func(pods map[cluster.Key]*cluster.Pod) {
			for _, p := range pods {
				if !p.HostNetwork && peer.Pods.Matches(labels.Set(p.Labels)) {
					m.owned(p, func(a netip.Addr) { out = append(out, a) })
				}
			}
		}
		if peer.Namespaces == nil {
			take(m.byNS[np.Namespace])
			continue
		}
		for ns, pods := range m.byNS {
			if m.peerNamespace(peer, ns) {
				take(pods)
			}
		}
	}
	return slices.Compact(sortAddrs(out))
}

// peerNamespace says whether peer's namespaceSelector takes namespace ns
// (a namespace without its object has no labels).
func (m *Model) peerNamespace(peer cluster.PolicyPeer, ns string) bool {
	var nsLabels map[string]string
	if n := m.namespaces[ns]; n != nil {
		nsLabels = n.Labels
	}
	return peer.Namespaces.Matches(labels.Set(nsLabels))
}

// namedAnywhere resolves r's named ports at every pod holding a port of one
// of their names.
func (m *Model) namedAnywhere(r cluster.PolicyRule) []NamedTarget {
	var out []NamedTarget
	for _, pp := range r.Ports {
		if pp.Named == "" {
			continue
		}
		for _, p := range m.byPortName[pp.Named] {
			m.owned(p, func(a netip.Addr) { out = append(out, m.namedAt(r, a)...) })
		}
	}
	return sortNamed(out)
}

func sortNamed(ns []NamedTarget) []NamedTarget {
	slices.SortFunc(ns, compareNamed)
	return slices.Compact(ns)
}

// PeerKey names what decides the pod peers of rule r of np: per pod peer,
// its namespace scope (np's namespace, or a namespaceSelector) and its
// podSelector. Rules with one key take the same pods in every state of the
// cluster, whatever their policy and direction, so their peers can be one
// set in the table.
func PeerKey(np *cluster.NetworkPolicy, r cluster.PolicyRule) string {
	var parts []string
	for _, peer := range r.Peers {
		if peer.IsBlock() {
			continue
		}
		scope := "ns=" + np.Namespace
		if peer.Namespaces != nil {
			scope = "nss=" + selectorKey(peer.Namespaces)
		}
		parts = append(parts, scope+";pods="+selectorKey(peer.Pods))
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), "|")
}

// selectorKey is a selector's canonical text (requirements sorted by key,
// values sorted), "*" for the one that takes everything.
func selectorKey(s labels.Selector) string {
	if s.Empty() {
		return "*"
	}
	return "(" + s.String() + ")"
}

// namedKey names the named ports entries of r (protocol and name).
func namedKey(r cluster.PolicyRule) string {
	var parts []string
	for _, pp := range r.Ports {
		if pp.Named != "" {
			parts = append(parts, string(pp.Protocol)+"/"+pp.Named)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// podPeer says whether one of r's pod peers (not ipBlocks) takes the pod p
// at address a.
func (m *Model) podPeer(np *cluster.NetworkPolicy, r cluster.PolicyRule, a netip.Addr, p *cluster.Pod) bool {
	return slices.ContainsFunc(r.Peers, func(peer cluster.PolicyPeer) bool {
		return !peer.IsBlock() && m.PeerMatches(np, peer, a, p)
	})
}

// namedAt resolves r's named ports at address a: (a, protocol, port) for
// each of the pod's container ports that a ports entry names with its
// protocol.
func (m *Model) namedAt(r cluster.PolicyRule, a netip.Addr) []NamedTarget {
	p := m.pods[a]
	if p == nil {
		return nil
	}
	var out []NamedTarget
	for _, pp := range r.Ports {
		if pp.Named == "" {
			continue
		}
		for _, cp := range p.Ports {
			if cp.Name == pp.Named && cp.Protocol == pp.Protocol {
				out = append(out, NamedTarget{Addr: a, Protocol: cp.Protocol, Port: cp.Port})
			}
		}
	}
	return out
}

func compareNamed(a, b NamedTarget) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.Protocol), string(b.Protocol)); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

func sortAddrs(as []netip.Addr) []netip.Addr {
	slices.SortFunc(as, netip.Addr.Compare)
	return as
}

// blockRanges is an ipBlock less its excepts, as disjoint ranges.
func blockRanges(p cluster.PolicyPeer) []AddrRange {
	out := []AddrRange{prefixRange(p.Block)}
	for _, e := range p.Except {
		er := prefixRange(e)
		var next []AddrRange
		for _, r := range out {
			next = append(next, subtract(r, er)...)
		}
		out = next
	}
	return out
}

func prefixRange(p netip.Prefix) AddrRange {
	p = p.Masked()
	last := p.Addr()
	for b := p.Bits(); b < p.Addr().BitLen(); b++ {
		last = setBit(last, b)
	}
	return AddrRange{From: p.Addr(), To: last}
}

// setBit sets bit i (0 the most significant) of a.
func setBit(a netip.Addr, i int) netip.Addr {
	s := a.AsSlice()
	s[i/8] |= 0x80 >> (i % 8)
	out, _ := netip.AddrFromSlice(s)
	return out
}

// subtract returns r less x (of the same family).
func subtract(r, x AddrRange) []AddrRange {
	if x.To.Less(r.From) || r.To.Less(x.From) {
		return []AddrRange{r}
	}
	var out []AddrRange
	if r.From.Less(x.From) {
		out = append(out, AddrRange{From: r.From, To: x.From.Prev()})
	}
	if x.To.Less(r.To) {
		out = append(out, AddrRange{From: x.To.Next(), To: r.To})
	}
	return out
}

// mergeRanges sorts ranges and joins those that overlap or touch, as an
// nftables interval set wants them.
func mergeRanges(rs []AddrRange) []AddrRange {
	slices.SortFunc(rs, func(a, b AddrRange) int { return a.From.Compare(b.From) })
	var out []AddrRange
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].From.Is4() == r.From.Is4() {
			last := &out[n-1]
			if next := last.To.Next(); !next.IsValid() || !next.Less(r.From) {
				if !r.To.Less(last.To) {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// Allows traces a flow through the program as the nftables table judges it:
// the egress half for a local source, the ingress half for a local
// destination. Only flows with a local end mean anything here.
func (prog *Program) Allows(f Flow) bool {
	return prog.dirAllows(Egress, f.Src, f.Dst, f) && prog.dirAllows(Ingress, f.Dst, f.Src, f)
}

func (prog *Program) dirAllows(d Direction, self, peer netip.Addr, f Flow) bool {
	isolated := false
	for _, pp := range prog.Policies {
		dir := pp.Dir[d]
		if !dir.Applies || !slices.Contains(dir.Selected, self) {
			continue
		}
		isolated = true
		for _, r := range dir.Rules {
			if r.peerMatches(peer) && r.portMatches(f) {
				return true
			}
		}
	}
	return !isolated
}

func (r RuleProgram) peerMatches(a netip.Addr) bool {
	if r.AnyPeer {
		return true
	}
	if _, ok := slices.BinarySearchFunc(r.Pods, a, netip.Addr.Compare); ok {
		return true
	}
	return slices.ContainsFunc(r.Blocks, func(b AddrRange) bool {
		return b.From.Is4() == a.Is4() && !a.Less(b.From) && !b.To.Less(a)
	})
}

func (r RuleProgram) portMatches(f Flow) bool {
	if r.AnyPort {
		return true
	}
	for _, p := range r.Ports {
		if p.Protocol == f.Protocol && (p.From == 0 || (p.From <= f.Port && f.Port <= p.To)) {
			return true
		}
	}
	return slices.Contains(r.Named, NamedTarget{Addr: f.Dst, Protocol: f.Protocol, Port: f.Port})
}
