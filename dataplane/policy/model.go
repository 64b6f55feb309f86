// Package policy enforces Kubernetes NetworkPolicy (networking.k8s.io/v1) for
// the pods of this node, in every Service proxy mode, with one implementation:
// an nftables table of its own, `inet podnet-policy`, programmed through
// netlink transactions (github.com/google/nftables).
//
// Why one table for every mode: every packet between pods crosses the node's
// forward path (pods on one node through cbr0 with br_netfilter, which runs
// the IPv4 and IPv6 forward hooks for bridged frames; pods on other nodes
// through the route), and by then the Service proxy has chosen the endpoint:
// iptables mode DNATs in prerouting, ebpf mode rewrites the destination at
// connect() in the pod's socket, nftables mode DNATs in prerouting. So a
// forward hook judges every mode's Service traffic by its real destination.
// Traffic from the node to its own pods (kubelet probes) leaves through
// output, not forward, and is never judged; hostNetwork pods have no address
// of their own and are out of scope.
//
// Policy state is data. Model evaluates the API's semantics over Pods,
// Namespaces and NetworkPolicies; Compile turns them into a Program: per
// policy, the local pods it selects, per rule its peers' addresses (pod IPs
// and ipBlocks, as intervals) and (address, protocol, port) for named
// ports. The Table writes them as elements: a verdict map per direction and
// family from a selected pod's address to the chain of the policies that
// select it, shared sets of peers (one per distinct peer selector) and of
// named ports, an interval set per ipBlock rule. Rules exist per policy rule
// and port entry, never per pod pair, so a pod appearing or a label change
// is an element update, and a first packet meets the rules of its own
// policies, not of every policy on the node.
package policy

import (
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Direction is ingress (to the selected pod) or egress (from it).
type Direction int

const (
	Ingress Direction = iota
	Egress
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Flow is the first packet of a connection, after the Service proxy chose
// its destination.
type Flow struct {
	Src, Dst netip.Addr
	Protocol cluster.Protocol
	Port     uint16
}

// Verdict is what NetworkPolicy says of a flow.
type Verdict struct {
	Allowed bool
	// Egress are the policies selecting the source for egress, Ingress
	// those selecting the destination for ingress (the policies a denied
	// flow is logged with).
	Egress, Ingress []cluster.Key
	// DeniedBy is the direction that refused, when !Allowed.
	DeniedBy Direction
}

// Model answers NetworkPolicy questions over one snapshot of the cluster. It
// is the reference the compiled program is checked against, and what proxyd
// status asks.
type Model struct {
	pods  map[netip.Addr]*cluster.Pod
	byKey map[cluster.Key]*cluster.Pod
	// byNS and byPortName index the pods by namespace and by the names
	// of their named ports, so a policy's selection, its peers and its
	// named ports look at the pods that can match, not at all of them:
	// walking every pod per policy took 17.8 s of CPU for 1,000 policies
	// over 5,000 pods (BENCHMARKS.md).
	byNS       map[string]map[cluster.Key]*cluster.Pod
	byPortName map[string]map[cluster.Key]*cluster.Pod
	// claims counts the pods claiming each address, so removing a pod
	// looks for another owner of its addresses only when there is one.
	claims     map[netip.Addr]int
	namespaces map[string]*cluster.Namespace
	policies   map[string][]*cluster.NetworkPolicy // by namespace, sorted by name
}

// NewModel indexes a snapshot. HostNetwork pods are left out: their
// addresses are their node's.
func NewModel(pods []*cluster.Pod, namespaces []*cluster.Namespace, policies []*cluster.NetworkPolicy) *Model {
	m := &Model{
		pods:       make(map[netip.Addr]*cluster.Pod),
		byKey:      make(map[cluster.Key]*cluster.Pod),
		byNS:       make(map[string]map[cluster.Key]*cluster.Pod),
		byPortName: make(map[string]map[cluster.Key]*cluster.Pod),
		claims:     make(map[netip.Addr]int),
		namespaces: make(map[string]*cluster.Namespace),
		policies:   make(map[string][]*cluster.NetworkPolicy),
	}
	for _, p := range pods {
		if !p.HostNetwork {
			m.addPod(p)
		}
	}
	for _, n := range namespaces {
		m.namespaces[n.Name] = n
	}
	for _, np := range policies {
		m.policies[np.Namespace] = append(m.policies[np.Namespace], np)
	}
	for _, l := range m.policies {
		slices.SortFunc(l, func(a, b *cluster.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	}
	return m
}

func (m *Model) addPod(p *cluster.Pod) {
	k := p.Key()
	m.byKey[k] = p
	for _, a := range p.IPs {
		m.pods[a] = p
		m.claims[a]++
	}
	index(m.byNS, p.Namespace, k, p)
	for _, np := range p.Ports {
		index(m.byPortName, np.Name, k, p)
	}
}

func index(idx map[string]map[cluster.Key]*cluster.Pod, at string, k cluster.Key, p *cluster.Pod) {
	if idx[at] == nil {
		idx[at] = make(map[cluster.Key]*cluster.Pod)
	}
	idx[at][k] = p
}

func unindex(idx map[string]map[cluster.Key]*cluster.Pod, at string, k cluster.Key) {
	delete(idx[at], k)
	if len(idx[at]) == 0 {
		delete(idx, at)
	}
}

// owned calls fn with each address of p that the model gives to p (an
// address two pods claim belongs to one of them).
func (m *Model) owned(p *cluster.Pod, fn func(netip.Addr)) {
	for _, a := range p.IPs {
		if m.pods[a] == p {
			fn(a)
		}
	}
}

// removePod takes a pod out and returns its addresses. An address another
// pod also claims goes back to that pod.
func (m *Model) removePod(k cluster.Key) []netip.Addr {
	p := m.byKey[k]
	if p == nil {
		return nil
	}
	delete(m.byKey, k)
	unindex(m.byNS, p.Namespace, k)
	for _, np := range p.Ports {
		unindex(m.byPortName, np.Name, k)
	}
	for _, a := range p.IPs {
		if m.claims[a]--; m.claims[a] == 0 {
			delete(m.claims, a)
		}
		if m.pods[a] != p {
			continue
		}
		delete(m.pods, a)
		if m.claims[a] == 0 {
			continue
		}
		for _, other := range m.byKey {
			if slices.Contains(other.IPs, a) {
				m.pods[a] = other
				break
			}
		}
	}
	return slices.Clone(p.IPs)
}

// addrsOf lists the addresses of the pods of namespace ns.
func (m *Model) addrsOf(ns string) []netip.Addr {
	var out []netip.Addr
	for _, p := range m.byNS[ns] {
		m.owned(p, func(a netip.Addr) { out = append(out, a) })
	}
	return out
}

func (m *Model) addPolicy(np *cluster.NetworkPolicy) {
	l := append(m.policies[np.Namespace], np)
	slices.SortFunc(l, func(a, b *cluster.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	m.policies[np.Namespace] = l
}

func (m *Model) removePolicy(k cluster.Key) {
	l := slices.DeleteFunc(m.policies[k.Namespace], func(np *cluster.NetworkPolicy) bool { return np.Name == k.Name })
	if len(l) == 0 {
		delete(m.policies, k.Namespace)
		return
	}
	m.policies[k.Namespace] = l
}

// Pod returns the pod holding addr, if any.
func (m *Model) Pod(addr netip.Addr) *cluster.Pod { return m.pods[addr] }

// Evaluate judges a flow: egress policies of its source, then ingress
// policies of its destination.
func (m *Model) Evaluate(f Flow) Verdict {
	var v Verdict
	src, dst := m.pods[f.Src], m.pods[f.Dst]
	egressOK, ingressOK := true, true
	if src != nil {
		v.Egress, egressOK = m.judge(src, Egress, f.Dst, dst, f)
	}
	if dst != nil {
		v.Ingress, ingressOK = m.judge(dst, Ingress, f.Src, src, f)
	}
	v.Allowed = egressOK && ingressOK
	if !egressOK {
		v.DeniedBy = Egress
	}
	return v
}

// judge says which policies select pod in direction d and whether one of
// their rules lets the peer (address, and pod when it is one) in on f's
// destination port.
func (m *Model) judge(pod *cluster.Pod, d Direction, peer netip.Addr, peerPod *cluster.Pod, f Flow) ([]cluster.Key, bool) {
	dstPod := peerPod
	if d == Ingress {
		dstPod = pod
	}
	var keys []cluster.Key
	allowed := false
	for _, np := range m.Selecting(pod, d) {
		keys = append(keys, np.Key())
		for _, r := range rules(np, d) {
			if !allowed && m.RuleAllows(np, r, peer, peerPod, dstPod, f.Protocol, f.Port) {
				allowed = true
			}
		}
	}
	return keys, len(keys) == 0 || allowed
}

func rules(np *cluster.NetworkPolicy, d Direction) []cluster.PolicyRule {
	if d == Egress {
		return np.EgressRules
	}
	return np.IngressRules
}

// Selecting returns the policies that select pod for direction d, by name.
func (m *Model) Selecting(pod *cluster.Pod, d Direction) []*cluster.NetworkPolicy {
	var out []*cluster.NetworkPolicy
	for _, np := range m.policies[pod.Namespace] {
		if Selects(np, pod) && applies(np, d) {
			out = append(out, np)
		}
	}
	return out
}

func applies(np *cluster.NetworkPolicy, d Direction) bool {
	if d == Egress {
		return np.Egress
	}
	return np.Ingress
}

// Selects says whether the policy's podSelector picks pod.
func Selects(np *cluster.NetworkPolicy, pod *cluster.Pod) bool {
	return !pod.HostNetwork && pod.Namespace == np.Namespace && np.PodSelector.Matches(labels.Set(pod.Labels))
}

// RuleAllows says whether rule r of np lets the peer at addr (peerPod when it
// is a pod) talk on protocol/port to dstPod (nil when the destination is no
// pod).
func (m *Model) RuleAllows(np *cluster.NetworkPolicy, r cluster.PolicyRule, addr netip.Addr, peerPod, dstPod *cluster.Pod, proto cluster.Protocol, port uint16) bool {
	if len(r.Ports) > 0 && !slices.ContainsFunc(r.Ports, func(pp cluster.PolicyPort) bool { return PortMatches(pp, dstPod, proto, port) }) {
		return false
	}
	if len(r.Peers) == 0 {
		return true
	}
	return slices.ContainsFunc(r.Peers, func(p cluster.PolicyPeer) bool { return m.PeerMatches(np, p, addr, peerPod) })
}

// PeerMatches says whether a from/to entry of np takes the address addr
// (held by pod, or nil).
func (m *Model) PeerMatches(np *cluster.NetworkPolicy, p cluster.PolicyPeer, addr netip.Addr, pod *cluster.Pod) bool {
	if p.IsBlock() {
		return BlockContains(p, addr)
	}
	if pod == nil || pod.HostNetwork || !p.Pods.Matches(labels.Set(pod.Labels)) {
		return false
	}
	if p.Namespaces == nil {
		return pod.Namespace == np.Namespace
	}
	var nsLabels map[string]string
	if ns := m.namespaces[pod.Namespace]; ns != nil {
		nsLabels = ns.Labels
	}
	return p.Namespaces.Matches(labels.Set(nsLabels))
}

// BlockContains says whether an ipBlock peer takes addr: inside cidr and
// outside every except.
func BlockContains(p cluster.PolicyPeer, addr netip.Addr) bool {
	if !p.Block.Contains(addr) {
		return false
	}
	return !slices.ContainsFunc(p.Except, func(e netip.Prefix) bool { return e.Contains(addr) })
}

// PortMatches says whether a ports entry takes protocol/port at the
// destination pod dst (named ports resolve there; nil dst has none).
func PortMatches(pp cluster.PolicyPort, dst *cluster.Pod, proto cluster.Protocol, port uint16) bool {
	if pp.Protocol != proto {
		return false
	}
	if pp.Named != "" {
		if dst == nil {
			return false
		}
		return slices.ContainsFunc(dst.Ports, func(np cluster.NamedPort) bool {
			return np.Name == pp.Named && np.Protocol == proto && np.Port == port
		})
	}
	return pp.Port == 0 || (pp.Port <= port && port <= pp.EndPort)
}
