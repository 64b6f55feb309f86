package nftables

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Firewall is the node firewall of one address family in podnet's table
// (hostnet.NodeFirewall): pod traffic leaving the cluster masqueraded and
// pod traffic forwarded, so a node in nftables mode keeps no podnet rule
// in iptables. Its chains start with node- and come after the Service
// proxy's at their hooks: NAT after the Service masquerading, accepts
// after the rejects of Services without endpoints.
type Firewall struct {
	Family ipfamily.Family
	Kernel Kernel
	mu     sync.Mutex
	// applied is what the last Ensure wrote; nil: unknown.
	applied map[string]*Chain
}

var _ hostnet.NodeFirewall = (*Firewall)(nil)

// Chains returns the firewall's chains for r. Pure.
func (f *Firewall) Chains(r hostnet.Rules) map[string]*Chain {
	s := Config{Family: f.Family}.sfx()
	fam := Match{Kind: MatchFamily}
	pods := func(fl Field, neg bool) Match {
		return Match{Kind: MatchPrefix, Field: fl, Neg: neg, Prefix: r.ClusterCIDR.Masked()}
	}
	post := &Chain{Name: nodePrefix + "postrouting-" + s, Hook: &Hook{Type: "nat", Hook: "postrouting", Priority: prioSrcNAT + 10},
		Rules: []Rule{{Match: []Match{fam, pods(FieldSaddr, false), pods(FieldDaddr, false)}, Do: []Stmt{{Kind: StmtReturn}}}}}
	if r.Masquerade {
		multicast := netip.MustParsePrefix("224.0.0.0/4")
		if f.Family == ipfamily.IPv6 {
			multicast = netip.MustParsePrefix("ff00::/8")
		}
		post.Rules = append(post.Rules, Rule{Match: []Match{fam, pods(FieldSaddr, false),
			{Kind: MatchPrefix, Field: FieldDaddr, Neg: true, Prefix: multicast}}, Do: []Stmt{{Kind: StmtMasquerade, Random: true}}})
	}
	fwd := &Chain{Name: nodePrefix + "forward-" + s, Hook: &Hook{Type: "filter", Hook: "forward", Priority: prioFilter + 10}, Rules: []Rule{
		{Match: []Match{fam, pods(FieldSaddr, false)}, Do: []Stmt{{Kind: StmtAccept}}},
		{Match: []Match{fam, pods(FieldDaddr, false)}, Do: []Stmt{{Kind: StmtAccept}}},
	}}
	return map[string]*Chain{post.Name: post, fwd.Name: fwd}
}

// Ensure implements hostnet.NodeFirewall: the chains are rewritten, in
// one transaction, unless the last Ensure wrote the same and the kernel
// still has them.
func (f *Firewall) Ensure(r hostnet.Rules) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	want := f.Chains(r)
	chains, _, err := f.Kernel.Objects()
	if err != nil {
		return false, fmt.Errorf("list table %s: %w", TableName, err)
	}
	present := 0
	for _, c := range chains {
		if want[c.Name] != nil {
			present++
		}
	}
	if present == len(want) && f.same(want) {
		return false, nil
	}
	ops := []Op{{Kind: OpAddTable}}
	for _, name := range sortedKeys(want) {
		ops = append(ops, Op{Kind: OpAddChain, Family: f.Family, Chain: want[name]}, Op{Kind: OpFlushChain, Family: f.Family, Chain: want[name]})
		for _, rule := range want[name].Rules {
			ops = append(ops, Op{Kind: OpAddRule, Family: f.Family, Chain: want[name], Rule: rule})
		}
	}
	f.applied = nil
	if err := f.Kernel.Apply(ops); err != nil {
		return false, fmt.Errorf("nftables transaction: %w", err)
	}
	f.applied = want
	return true, nil
}

func (f *Firewall) same(want map[string]*Chain) bool {
	if len(f.applied) != len(want) {
		return false
	}
	for name, c := range want {
		a := f.applied[name]
		if a == nil || !sameRules(a.Rules, c.Rules) || *a.Hook != *c.Hook {
			return false
		}
	}
	return true
}

// Remove implements hostnet.NodeFirewall: the family's node chains go,
// the table stays (the Service proxy's).
func (f *Firewall) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = nil
	chains, _, err := f.Kernel.Objects()
	if err != nil {
		return fmt.Errorf("list table %s: %w", TableName, err)
	}
	var ops []Op
	for _, c := range chains {
		if _, ok := f.Chains(hostnet.Rules{ClusterCIDR: f.Family.Any()})[c.Name]; ok {
			ops = append(ops, Op{Kind: OpFlushChain, Family: f.Family, Chain: c}, Op{Kind: OpDelChain, Family: f.Family, Chain: c})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	return f.Kernel.Apply(ops)
}
