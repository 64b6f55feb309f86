package policy

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/roottest"
)

// rulesMet walks the policy table in the kernel as the first packet of a
// new connection to (ingress) or from (egress) addr is judged when no rule
// allows it, the longest way: the base chain's rules up to its family's
// verdict map, then the chain the map sends addr to and every chain that
// one jumps to, all their rules. It returns the number of rules on the way
// and the chains walked.
func rulesMet(t testing.TB, conn *nftables.Conn, d Direction, addr netip.Addr) (int, []string) {
	t.Helper()
	table := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	rules := func(chain string) []*nftables.Rule {
		rs, err := conn.GetRules(table, &nftables.Chain{Name: chain, Table: table})
		if err != nil {
			t.Fatalf("list rules of %s: %v", chain, err)
		}
		return rs
	}
	vmap := vmapName(d, ipfamily.Of(addr))
	n, chains := 0, []string{dirNames[d]}
	for _, r := range rules(dirNames[d]) {
		n++
		if slices.ContainsFunc(r.Exprs, func(e expr.Any) bool {
			l, ok := e.(*expr.Lookup)
			return ok && l.IsDestRegSet && l.SetName == vmap
		}) {
			break
		}
	}
	sets, err := conn.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == vmap })
	if i < 0 {
		t.Fatalf("no verdict map %s", vmap)
	}
	elems, err := conn.GetSetElements(sets[i])
	if err != nil {
		t.Fatal(err)
	}
	j := slices.IndexFunc(elems, func(e nftables.SetElement) bool { return bytes.Equal(e.Key, addr.AsSlice()) })
	if j < 0 {
		return n, chains
	}
	var walk func(chain string)
	walk = func(chain string) {
		chains = append(chains, chain)
		for _, r := range rules(chain) {
			n++
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
					walk(v.Chain)
				}
			}
		}
	}
	walk(elemVerdict(elems[j]).Chain)
	return n, chains
}

// TestFirstPacketRulesDoNotGrowWithPolicies: the benchmark's server pod
// (selected by its namespace's default deny and one allow) meets as many
// rules on a node with the 22 policies node1 holds as on one with all
// 1,000, in both families: the verdict map sends its address to its own
// policies' chains. (Before the maps, its first packet walked one rule per
// policy and family in in-allow and in-deny: about 4,000 more.)
func TestFirstPacketRulesDoNotGrowWithPolicies(t *testing.T) {
	_, h := roottest.NetNS(t, "podnet-poltrace")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())), nftmsg.Buffers())
	if err != nil {
		t.Fatal(err)
	}
	pods, nss, pols := firstPacketWorld(t)
	server := []netip.Addr{netip.MustParseAddr(ips["r/web"]), netip.MustParseAddr(ips["r/web6"])}
	met := map[string][]int{}
	for _, bl := range benchLocals {
		tbl := NewTable(conn, Options{Families: ipfamily.All, LogGroup: 24})
		prog := NewModel(pods, nss, pols).Compile(bl.local)
		if err := tbl.Apply(prog); err != nil {
			t.Fatal(err)
		}
		for _, a := range server {
			n, chains := rulesMet(t, conn, Ingress, a)
			t.Logf("%s (%d policies): a first packet to %s meets %d rules in %v", bl.name, len(prog.Policies), a, n, chains)
			if len(chains) < 4 {
				t.Errorf("%s: the way to %s is %v: not through its group and the policy that allows it", bl.name, a, chains)
			}
			met[bl.name] = append(met[bl.name], n)
		}
		if err := tbl.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(met["Node1"], met["AllPolicies"]) {
		t.Errorf("rules a first packet meets (IPv4, IPv6): %v with node1's policies, %v with all: want the same", met["Node1"], met["AllPolicies"])
	}
}
