// Package nftables is the nftables backend of the Service proxy: it turns
// proxy.ServicePorts into the contents of one nftables table of podnet's
// own (inet podnet, both address families), written through netlink
// (github.com/google/nftables) in one transaction per sync. No exec, no
// text to parse, no global flush: nothing outside the table is touched, so
// it lives beside iptables rules and other programs' tables.
//
// The layout is built on maps, not on a rule per endpoint or per Service:
//
//   - services-<f> looks (daddr . l4proto . dport) up in the verdict map
//     service-ips-<f>, which sends a cluster IP to the port's chain
//     svc-<f>-<hash> and an external or load-balancer IP to ext-<f>-<hash>
//     (or fw-<f>-<hash>, which lets loadBalancerSourceRanges, a set, in);
//     NodePorts are (l4proto . dport) in service-nodeports-<f>, matched on
//     destinations of type local (fib).
//   - A port's chain picks its endpoint with one rule: DNAT to the value of
//     numgen random mod N in the endpoint map ep-<f>-<hash> (index →
//     address . port), or lep-<f>-<hash> for local endpoints. An endpoint
//     change rewrites elements of that map (and the one rule when N
//     changes); nothing else.
//   - Session affinity is a dynamic map per port (client address →
//     endpoint, with the Service's timeout): a client found there goes back
//     to its endpoint and refreshes the timeout; a new client is recorded
//     with the endpoint numgen picked.
//   - Ports without any endpoint are elements of no-endpoint-services-<f>
//     and no-endpoint-nodeports-<f>, which filter chains answer with a
//     reject; no chain of their own.
//   - Hairpin traffic (an endpoint reaching itself through its Service) is
//     masqueraded by one rule matching (saddr . daddr) in the set
//     hairpin-<f> of local endpoints; other masquerading follows the mark
//     0x4000, as in the iptables mode.
//
// Every object of a family is named with its family (-ip4, -ip6) and
// belongs to that family's Proxier; the table is shared. Base chains start
// with a jump guarded by meta nfproto, so the body chains read ip or ip6
// headers only of their own family. Objects whose names start with node-
// belong to the node firewall (Firewall).
package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"slices"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// MarkMasq marks packets to masquerade in postrouting, kube-proxy's bit.
const MarkMasq = 0x4000

const (
	protoTCP  = 6
	protoUDP  = 17
	protoSCTP = 132
)

// Base chain priorities: NAT where the kernel's dstnat and srcnat are;
// the reject checks before the filter chains of other programs.
const (
	prioDstNAT = -100
	prioSrcNAT = 100
	prioFilter = -110
)

// Config is what the table's contents need besides the ServicePorts.
type Config struct {
	// Family is the address family of the objects written.
	Family ipfamily.Family
	// ClusterCIDR is the pod network; traffic to a cluster IP from
	// outside it is masqueraded. Invalid: only MasqueradeAll does.
	ClusterCIDR netip.Prefix
	// NodePortAddresses limits NodePorts to local addresses in these
	// prefixes; empty: every local address but loopback.
	NodePortAddresses []netip.Prefix
	MasqueradeAll     bool
}

func (c Config) sfx() string {
	if c.Family == ipfamily.IPv6 {
		return "ip6"
	}
	return "ip4"
}

// names of the family's shared objects.
type names struct {
	services, nodePorts, noEndpoints, noEndpointNodePorts, hairpin string
	servicesChain, masqChain, rejectChain, forwardChain            string
}

func (c Config) names() names {
	s := c.sfx()
	return names{
		services: "service-ips-" + s, nodePorts: "service-nodeports-" + s,
		noEndpoints: "no-endpoint-services-" + s, noEndpointNodePorts: "no-endpoint-nodeports-" + s,
		hairpin:       "hairpin-" + s,
		servicesChain: "services-" + s, masqChain: "masquerading-" + s,
		rejectChain: "reject-" + s, forwardChain: "forward-" + s,
	}
}

// Static returns the family's objects that do not depend on Services:
// base chains, body chains and the shared sets, empty.
func (c Config) Static() *Table {
	n := c.names()
	t := &Table{Family: c.Family, Chains: make(map[string]*Chain), Sets: make(map[string]*Set)}
	addr := TypeAddr
	t.Sets[n.services] = &Set{Name: n.services, Key: []Type{addr, TypeProto, TypePort}, Data: []Type{TypeVerdict}}
	t.Sets[n.nodePorts] = &Set{Name: n.nodePorts, Key: []Type{TypeProto, TypePort}, Data: []Type{TypeVerdict}}
	t.Sets[n.noEndpoints] = &Set{Name: n.noEndpoints, Key: []Type{addr, TypeProto, TypePort}}
	t.Sets[n.noEndpointNodePorts] = &Set{Name: n.noEndpointNodePorts, Key: []Type{TypeProto, TypePort}}
	t.Sets[n.hairpin] = &Set{Name: n.hairpin, Key: []Type{addr, addr}}

	guard := func(kind StmtKind, chain string) Rule {
		return Rule{Match: []Match{{Kind: MatchFamily}}, Do: []Stmt{{Kind: kind, Chain: chain}}}
	}
	s := c.sfx()
	base := func(name, typ, hook string, prio int32, rules ...Rule) {
		t.Chains[name+"-"+s] = &Chain{Name: name + "-" + s, Hook: &Hook{Type: typ, Hook: hook, Priority: prio}, Rules: rules}
	}
	base("nat-prerouting", "nat", "prerouting", prioDstNAT, guard(StmtJump, n.servicesChain))
	base("nat-output", "nat", "output", prioDstNAT, guard(StmtJump, n.servicesChain))
	base("nat-postrouting", "nat", "postrouting", prioSrcNAT, guard(StmtJump, n.masqChain))
	base("filter-input", "filter", "input", prioFilter, guard(StmtJump, n.rejectChain))
	base("filter-forward", "filter", "forward", prioFilter, guard(StmtJump, n.rejectChain), guard(StmtJump, n.forwardChain))
	base("filter-output", "filter", "output", prioFilter, guard(StmtJump, n.rejectChain))

	svcKey := []Field{FieldDaddr, FieldL4Proto, FieldDport}
	npKey := []Field{FieldL4Proto, FieldDport}
	services := []Rule{{Do: []Stmt{{Kind: StmtVmap, Key: svcKey, Map: n.services}}}}
	for _, m := range c.nodePortMatches() {
		services = append(services, Rule{Match: m, Do: []Stmt{{Kind: StmtVmap, Key: npKey, Map: n.nodePorts}}})
	}
	t.Chains[n.servicesChain] = &Chain{Name: n.servicesChain, Rules: services}

	reject := []Rule{{Match: []Match{{Kind: MatchNew}, {Kind: MatchSet, Key: svcKey, Set: n.noEndpoints}}, Do: []Stmt{{Kind: StmtReject}}}}
	for _, m := range c.nodePortMatches() {
		m = append([]Match{{Kind: MatchNew}}, m...)
		reject = append(reject, Rule{Match: append(m, Match{Kind: MatchSet, Key: npKey, Set: n.noEndpointNodePorts}), Do: []Stmt{{Kind: StmtReject}}})
	}
	t.Chains[n.rejectChain] = &Chain{Name: n.rejectChain, Rules: reject}

	t.Chains[n.forwardChain] = &Chain{Name: n.forwardChain, Rules: []Rule{
		{Match: []Match{{Kind: MatchMark, Mark: MarkMasq}}, Do: []Stmt{{Kind: StmtAccept}}},
		{Match: []Match{{Kind: MatchEstablished}}, Do: []Stmt{{Kind: StmtAccept}}},
	}}
	t.Chains[n.masqChain] = &Chain{Name: n.masqChain, Rules: []Rule{
		{Match: []Match{{Kind: MatchSet, Key: []Field{FieldSaddr, FieldDaddr}, Set: n.hairpin}}, Do: []Stmt{{Kind: StmtMasquerade}}},
		{Match: []Match{{Kind: MatchMark, Mark: MarkMasq, Neg: true}}, Do: []Stmt{{Kind: StmtReturn}}},
		{Do: []Stmt{{Kind: StmtMarkXor, Mark: MarkMasq}}},
		{Match: []Match{{Kind: MatchDNAT}}, Do: []Stmt{{Kind: StmtMasquerade, Random: true}}},
	}}
	return t
}

// nodePortMatches are the alternatives a destination must meet to be a
// NodePort's: local and not loopback (DNAT from 127.0.0.1 to a pod would
// need route_localnet; IPv6 never routes from ::1), or local and in one of
// NodePortAddresses.
func (c Config) nodePortMatches() [][]Match {
	local := Match{Kind: MatchLocal, Field: FieldDaddr}
	if len(c.NodePortAddresses) == 0 {
		return [][]Match{{{Kind: MatchPrefix, Field: FieldDaddr, Neg: true, Prefix: c.Family.Loopback()}, local}}
	}
	var out [][]Match
	for _, p := range c.NodePortAddresses {
		if c.Family.HasPrefix(p) {
			out = append(out, []Match{{Kind: MatchPrefix, Field: FieldDaddr, Prefix: p.Masked()}, local})
		}
	}
	return out
}

// sharedElem is an element a port puts into one of the shared sets.
type sharedElem struct {
	set  string
	elem Elem
}

// portObjects is what one ServicePort adds to the table.
type portObjects struct {
	chains []*Chain
	sets   []*Set
	shared []sharedElem
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func portHash(n proxy.PortName) string {
	sum := sha256.Sum256([]byte(n.String()))
	return b32.EncodeToString(sum[:])[:16]
}

func protoNum(p cluster.Protocol) uint32 {
	switch p {
	case cluster.UDP:
		return protoUDP
	case cluster.SCTP:
		return protoSCTP
	}
	return protoTCP
}

// portCtx is what every part of one ServicePort's objects shares.
type portCtx struct {
	c   Config
	n   names
	sp  *proxy.ServicePort
	id  string // <family>-<hash>, in the port's objects' names
	out *portObjects
}

func (p *portCtx) frontend(a netip.Addr) []Value {
	return []Value{{Addr: a}, {Num: protoNum(p.sp.Protocol)}, {Num: uint32(p.sp.Port)}}
}

func (p *portCtx) share(set string, e Elem) {
	p.out.shared = append(p.out.shared, sharedElem{set, e})
}

// Port returns the objects of one ServicePort.
func (c Config) port(sp *proxy.ServicePort) *portObjects {
	p := &portCtx{c: c, n: c.names(), sp: sp, id: c.sfx() + "-" + portHash(sp.Name), out: &portObjects{}}
	if !sp.HasEndpoints {
		for _, a := range p.frontends() {
			p.share(p.n.noEndpoints, Elem{Key: p.frontend(a)})
		}
		if sp.NodePort != 0 {
			p.share(p.n.noEndpointNodePorts, Elem{Key: []Value{{Num: protoNum(sp.Protocol)}, {Num: uint32(sp.NodePort)}}})
		}
		return p.out
	}
	svc := &Chain{Name: "svc-" + p.id}
	switch {
	case c.MasqueradeAll:
		svc.Rules = append(svc.Rules, Rule{Do: []Stmt{{Kind: StmtMarkOr, Mark: MarkMasq}}})
	case c.ClusterCIDR.IsValid():
		svc.Rules = append(svc.Rules, Rule{Match: []Match{{Kind: MatchPrefix, Field: FieldSaddr, Neg: true, Prefix: c.ClusterCIDR.Masked()}},
			Do: []Stmt{{Kind: StmtMarkOr, Mark: MarkMasq}}})
	}
	svc.Rules = append(svc.Rules, p.target(sp.InternalEndpoints(), sp.InternalPolicyLocal, nil)...)
	p.out.chains = append(p.out.chains, svc)
	p.share(p.n.services, Elem{Key: p.frontend(sp.ClusterIP), Goto: svc.Name})
	p.hairpin(sp.InternalEndpoints())
	if sp.External() {
		p.external()
	}
	return p.out
}

// frontends are the addresses the port is reached at: cluster IP,
// external IPs, load-balancer IPs.
func (p *portCtx) frontends() []netip.Addr {
	out := []netip.Addr{p.sp.ClusterIP}
	out = append(out, p.sp.ExternalIPs...)
	return append(out, p.sp.LoadBalancerIPs...)
}

func (p *portCtx) hairpin(eps []proxy.Endpoint) {
	for _, e := range eps {
		if e.Local {
			p.share(p.n.hairpin, Elem{Key: []Value{{Addr: e.Addr()}, {Addr: e.Addr()}}})
		}
	}
}

// external adds the external entry chain (by traffic policy), the
// firewall of source ranges, and the external frontends and NodePort.
func (p *portCtx) external() {
	sp := p.sp
	ext := &Chain{Name: "ext-" + p.id}
	if sp.ExternalPolicyLocal {
		// Pods and the node itself may use any endpoint (and the node's
		// own traffic is masqueraded); other clients keep their source
		// address and reach local endpoints only.
		clusterEps, clusterLocal := sp.ClusterEndpoints, false
		if len(clusterEps) == 0 {
			clusterEps, clusterLocal = sp.LocalEndpoints, true
		}
		if p.c.ClusterCIDR.IsValid() {
			ext.Rules = append(ext.Rules, p.target(clusterEps, clusterLocal,
				[]Match{{Kind: MatchPrefix, Field: FieldSaddr, Prefix: p.c.ClusterCIDR.Masked()}})...)
		}
		fromNode := []Match{{Kind: MatchLocal, Field: FieldSaddr}}
		ext.Rules = append(ext.Rules, Rule{Match: fromNode, Do: []Stmt{{Kind: StmtMarkOr, Mark: MarkMasq}}})
		ext.Rules = append(ext.Rules, p.target(clusterEps, clusterLocal, fromNode)...)
		ext.Rules = append(ext.Rules, p.target(sp.LocalEndpoints, true, nil)...)
	} else {
		ext.Rules = append(ext.Rules, Rule{Do: []Stmt{{Kind: StmtMarkOr, Mark: MarkMasq}}})
		ext.Rules = append(ext.Rules, p.target(sp.ClusterEndpoints, false, nil)...)
	}
	p.out.chains = append(p.out.chains, ext)
	p.hairpin(sp.ExternalEndpoints())
	for _, a := range sp.ExternalIPs {
		p.share(p.n.services, Elem{Key: p.frontend(a), Goto: ext.Name})
	}
	lb := p.firewall(ext.Name)
	for _, a := range sp.LoadBalancerIPs {
		p.share(p.n.services, Elem{Key: p.frontend(a), Goto: lb})
	}
	if sp.NodePort != 0 {
		p.share(p.n.nodePorts, Elem{Key: []Value{{Num: protoNum(sp.Protocol)}, {Num: uint32(sp.NodePort)}}, Goto: ext.Name})
	}
}

// firewall adds, for load-balancer IPs with source ranges, the set of
// ranges and the chain letting them on to ext (the rest is dropped); it
// returns the chain the load-balancer IPs go to.
func (p *portCtx) firewall(ext string) string {
	sp := p.sp
	ranges := mergePrefixes(p.c.Family.Prefixes(sp.LoadBalancerSourceRanges))
	if len(sp.LoadBalancerIPs) == 0 || len(ranges) == 0 || ranges[0].Bits() == 0 {
		return ext
	}
	set := &Set{Name: "src-" + p.id, Key: []Type{TypeAddr}, Interval: true}
	for _, r := range ranges {
		set.Elems = append(set.Elems, Elem{Key: []Value{{Prefix: r}}})
	}
	fw := &Chain{Name: "fw-" + p.id, Rules: []Rule{
		{Match: []Match{{Kind: MatchSet, Key: []Field{FieldSaddr}, Set: set.Name}}, Do: []Stmt{{Kind: StmtGoto, Chain: ext}}},
		{Do: []Stmt{{Kind: StmtDrop}}},
	}}
	p.out.sets = append(p.out.sets, set)
	p.out.chains = append(p.out.chains, fw)
	return fw.Name
}

// mergePrefixes drops prefixes held by others (an interval set refuses
// overlapping elements), sorted.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	in := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		in = append(in, p.Masked())
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range in {
		if len(out) > 0 && out[len(out)-1].Contains(p.Addr()) && out[len(out)-1].Bits() <= p.Bits() {
			continue
		}
		out = append(out, p)
	}
	return out
}

// target returns the rules that send traffic (meeting pre) to one of eps:
// one DNAT through the endpoint map (with affinity, a lookup of the
// client first), or a drop when eps is empty (the port has endpoints, none
// for this traffic).
func (p *portCtx) target(eps []proxy.Endpoint, local bool, pre []Match) []Rule {
	if len(eps) == 0 {
		return []Rule{{Match: pre, Do: []Stmt{{Kind: StmtDrop}}}}
	}
	name, aff := "ep-"+p.id, "aff-"+p.id
	if local {
		name, aff = "lep-"+p.id, "laff-"+p.id
	}
	if !slices.ContainsFunc(p.out.sets, func(s *Set) bool { return s.Name == name }) {
		m := &Set{Name: name, Key: []Type{TypeIndex}, Data: []Type{TypeAddr, TypePort}}
		for i, e := range eps {
			m.Elems = append(m.Elems, Elem{Key: []Value{{Num: uint32(i)}}, To: e.AddrPort()})
		}
		p.out.sets = append(p.out.sets, m)
		if p.sp.AffinityTimeout > 0 {
			p.out.sets = append(p.out.sets, &Set{Name: aff, Key: []Type{TypeAddr}, Data: []Type{TypeAddr, TypePort},
				Timeout: p.sp.AffinityTimeout.Round(time.Second)})
		}
	}
	pick := Stmt{Kind: StmtDNATRandom, Map: name, N: uint32(len(eps))}
	if p.sp.AffinityTimeout <= 0 {
		return []Rule{{Match: pre, Do: []Stmt{pick}}}
	}
	pick.Affinity = aff
	return []Rule{
		{Match: pre, Do: []Stmt{{Kind: StmtDNATAffinity, Affinity: aff}}},
		{Match: pre, Do: []Stmt{pick}},
	}
}

// Generate returns the whole table of the family for ports: what a full
// sync writes. Pure.
func (c Config) Generate(ports map[cluster.Key][]*proxy.ServicePort) *Table {
	t := c.Static()
	sh := newShared()
	for _, k := range sortedServiceKeys(ports) {
		for _, sp := range ports[k] {
			o := c.port(sp)
			for _, ch := range o.chains {
				t.Chains[ch.Name] = ch
			}
			for _, s := range o.sets {
				t.Sets[s.Name] = s
			}
			sh.add(k, o.shared)
		}
	}
	sh.fill(t)
	return t
}

func sortedServiceKeys(ports map[cluster.Key][]*proxy.ServicePort) []cluster.Key {
	keys := make([]cluster.Key, 0, len(ports))
	for k := range ports {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cluster.Key) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return keys
}
