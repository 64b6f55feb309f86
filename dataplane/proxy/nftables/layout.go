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
//   - A port's chain picks its endpoint with one rule: DNAT to the value
//     of (target id . numgen random mod N) in endpoints-<f>-<shard>, one
//     of the family's Shards endpoint maps. A target is a port's endpoints
//     for one scope (all of them, or the node's own for a traffic policy
//     Local); its id is 64 bits of the port's hash, the last bit telling
//     the scope, and its shard the id modulo Shards. Neither one map a
//     port nor one map for all: the kernel finds a set by name by walking
//     the table's list of sets (a map a port: a full sync grows with the
//     square of the ports, 16.5 s CPU at 10,000 Services × 10 endpoints),
//     and it walks every element of a map for each chain a rule looking it
//     up is added to (one map: 309 s CPU at the same size); with Shards
//     maps both walks are short (BENCHMARKS.md). An endpoint change
//     rewrites elements of one map (and the one rule when N changes);
//     nothing else.
//   - Session affinity is one dynamic map of the family, affinity-<f>
//     ((target id . client address) → endpoint, each element with its
//     port's timeout): a client found there whose endpoint is still one of
//     the target's (affinity-endpoints-<f>, (target id . endpoint)) goes
//     back to it and refreshes the timeout; a client whose endpoint left is
//     deleted from the map and, like a new client, recorded with the
//     endpoint numgen picks. So an endpoint leaving moves its own clients
//     only, and nothing of the map is written by a sync.
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
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// MaxAffinity is the affinity map's timeout, the longest a Service may
// ask for (each rule sets its port's own).
const MaxAffinity = 24 * time.Hour

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
	// Shards is the number of endpoint maps of the family; 0:
	// DefaultShards.
	Shards int
}

// DefaultShards is the number of endpoint maps: at 10,000 Services × 10
// endpoints a map holds ~430 elements, bound by ~40 chains.
const DefaultShards = 256

func (c Config) shards() int {
	if c.Shards <= 0 || c.Shards > DefaultShards {
		return DefaultShards
	}
	return c.Shards
}

// endpointMap names the endpoint map of target id.
func (c Config) endpointMap(id uint64) string {
	return fmt.Sprintf("%s%s-%02x", endpointMapPrefix, c.sfx(), id%uint64(c.shards()))
}

const endpointMapPrefix = "endpoints-"

// endpointMapSpec declares an endpoint map.
func endpointMapSpec(f ipfamily.Family, name string) *Set {
	return &Set{Name: name, Key: []Type{TypeID, TypeIndex}, Data: []Type{TypeAddr, TypePort}}
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
	affinity, affinityEndpoints                                    string
	servicesChain, masqChain, rejectChain, forwardChain            string
}

func (c Config) names() names {
	s := c.sfx()
	return names{
		services: "service-ips-" + s, nodePorts: "service-nodeports-" + s,
		noEndpoints: "no-endpoint-services-" + s, noEndpointNodePorts: "no-endpoint-nodeports-" + s,
		hairpin:  "hairpin-" + s,
		affinity: "affinity-" + s, affinityEndpoints: "affinity-endpoints-" + s,
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
	for i := range c.shards() {
		name := c.endpointMap(uint64(i))
		t.Sets[name] = endpointMapSpec(c.Family, name)
	}
	t.Sets[n.affinity] = &Set{Name: n.affinity, Key: []Type{TypeID, addr}, Data: []Type{addr, TypePort}, Timeout: MaxAffinity}
	t.Sets[n.affinityEndpoints] = &Set{Name: n.affinityEndpoints, Key: []Type{TypeID, addr, TypePort}}

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

// targetID is the id of a port's target: the first 64 bits of the hash in
// the port's chain names (hash, 16 base32 digits, 80 bits), the last bit
// set for the local endpoints. false when hash is not one.
func targetID(hash string, local bool) (uint64, bool) {
	b, err := b32.DecodeString(hash)
	if err != nil || len(b) < 8 {
		return 0, false
	}
	id := binary.BigEndian.Uint64(b) &^ 1
	if local {
		id |= 1
	}
	return id, true
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
	c    Config
	n    names
	sp   *proxy.ServicePort
	id   string // <family>-<hash>, in the port's objects' names
	hash string
	out  *portObjects
	// targets written, by id
	targets map[uint64]bool
}

func (p *portCtx) frontend(a netip.Addr) []Value {
	return []Value{{Addr: a}, {Num: protoNum(p.sp.Protocol)}, {Num: uint32(p.sp.Port)}}
}

func (p *portCtx) share(set string, e Elem) {
	p.out.shared = append(p.out.shared, sharedElem{set, e})
}

// Port returns the objects of one ServicePort.
func (c Config) port(sp *proxy.ServicePort) *portObjects {
	h := portHash(sp.Name)
	p := &portCtx{c: c, n: c.names(), sp: sp, id: c.sfx() + "-" + h, hash: h, out: &portObjects{}, targets: map[uint64]bool{}}
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
// client first, and the client forgotten when its endpoint left), or a
// drop when eps is empty (the port has endpoints, none for this traffic).
func (p *portCtx) target(eps []proxy.Endpoint, local bool, pre []Match) []Rule {
	if len(eps) == 0 {
		return []Rule{{Match: pre, Do: []Stmt{{Kind: StmtDrop}}}}
	}
	id, _ := targetID(p.hash, local)
	affinity := p.sp.AffinityTimeout > 0
	timeout := p.sp.AffinityTimeout.Round(time.Second)
	if !p.targets[id] {
		p.targets[id] = true
		for i, e := range eps {
			p.share(p.c.endpointMap(id), Elem{Key: []Value{{ID: id}, {Num: uint32(i)}}, To: e.AddrPort()})
			if affinity {
				p.share(p.n.affinityEndpoints, Elem{Key: []Value{{ID: id}, {Addr: e.Addr()}, {Num: uint32(e.Port)}}})
			}
		}
	}
	pick := Stmt{Kind: StmtDNATRandom, Map: p.c.endpointMap(id), ID: id, N: uint32(len(eps))}
	if !affinity {
		return []Rule{{Match: pre, Do: []Stmt{pick}}}
	}
	pick.Affinity, pick.Timeout = p.n.affinity, timeout
	return []Rule{
		{Match: pre, Do: []Stmt{{Kind: StmtDNATAffinity, Affinity: p.n.affinity, Map: p.n.affinityEndpoints, ID: id, Timeout: timeout}}},
		{Match: pre, Do: []Stmt{{Kind: StmtForget, Affinity: p.n.affinity, ID: id}}},
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
