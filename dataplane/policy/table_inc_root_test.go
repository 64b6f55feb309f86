package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestTableFollowsRandomChanges applies the Compiler's program after each
// random change of TestIncrementalEqualsFullCompile's world to a table in a
// network namespace, incrementally (policies replaced with a new shape,
// groups appearing and going, peers shared and let go, in one transaction
// each): every transaction is accepted, every set holds what the Table
// recorded, and the kernel's verdict maps send each selected address, and
// no other, to a chain that jumps to the policies selecting it (those with
// rules) and counts a drop for each.
func TestTableFollowsRandomChanges(t *testing.T) {
	_, h := roottest.NetNS(t, "podnet-polinc")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())), nftmsg.Buffers())
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(3) {
		w := &world{rnd: rand.New(rand.NewPCG(seed, 7)), t: t, pods: map[cluster.Key]*cluster.Pod{},
			nss: map[string]*cluster.Namespace{}, pols: map[cluster.Key]*cluster.NetworkPolicy{}}
		const slots = 24
		for i := range slots / 2 {
			p := w.pod(i)
			w.pods[p.Key()] = p
		}
		for i := range 4 {
			np := w.policy(w.pick(wNamespaces), fmt.Sprintf("np%d", i))
			w.pols[np.Key()] = np
		}
		c := NewCompiler(NewModel(slices.Collect(maps.Values(w.pods)), nil, slices.Collect(maps.Values(w.pols))), onNode("node1"))
		tbl := NewTable(conn, Options{Families: ipfamily.All, LogGroup: 24})
		selected := 0
		for i := range 60 {
			what := "first apply"
			if i > 0 {
				what = w.step(c, slots)
			}
			step := fmt.Sprintf("seed %d step %d (%s)", seed, i, what)
			prog := c.Program()
			if err := tbl.Apply(prog); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			kernelSetsHold(t, step, conn, tbl)
			selected += kernelGroupsAgree(t, step, conn, tbl, prog)
		}
		if selected == 0 {
			t.Fatalf("seed %d: no address was ever selected: the test proves nothing", seed)
		}
		if err := tbl.Remove(); err != nil {
			t.Fatal(err)
		}
	}
}

// kernelGroupsAgree checks the verdict maps and group chains in the kernel
// against prog, and returns how many (address, direction) pairs it checked.
func kernelGroupsAgree(t *testing.T, step string, conn *nftables.Conn, tbl *Table, prog *Program) int {
	t.Helper()
	chainOf := map[string]cluster.Key{} // a policy chain's name: its policy
	for k, inst := range tbl.applied {
		for d := range dirNames {
			chainOf[inst.chainName(Direction(d))] = k
		}
	}
	sets, err := conn.GetSets(tbl.table)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for d := range dirNames {
		want := map[netip.Addr][]string{}
		jumps := map[netip.Addr][]string{}
		for _, pp := range prog.Policies {
			if dir := pp.Dir[d]; dir.Applies {
				for _, a := range dir.Selected {
					want[a] = append(want[a], pp.Key.String())
					if len(dir.Rules) > 0 {
						jumps[a] = append(jumps[a], pp.Key.String())
					}
				}
			}
		}
		got := map[netip.Addr]string{}
		for _, f := range tbl.opts.Families {
			i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == vmapName(Direction(d), f) })
			elems, err := conn.GetSetElements(sets[i])
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range elems {
				a, _ := netip.AddrFromSlice(e.Key)
				got[a] = elemVerdict(e).Chain
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %s verdict maps hold %d addresses, want %d", step, dirNames[d], len(got), len(want))
		}
		for a, policies := range want {
			gotJumps, gotCounted := groupPolicies(t, conn, tbl, got[a], chainOf)
			if !slices.Equal(sorted(gotJumps), sorted(jumps[a])) || !slices.Equal(sorted(gotCounted), sorted(policies)) {
				t.Errorf("%s: %s %s goes to %q, which jumps to %v and counts %v; want jumps to %v and counts %v",
					step, dirNames[d], a, got[a], gotJumps, gotCounted, jumps[a], policies)
			}
			checked++
		}
	}
	return checked
}

// groupPolicies reads a group chain from the kernel: the policies it jumps
// to and those whose dropped counter it counts.
func groupPolicies(t *testing.T, conn *nftables.Conn, tbl *Table, chain string, chainOf map[string]cluster.Key) (jumps, counted []string) {
	t.Helper()
	if chain == "" {
		return nil, nil
	}
	rules, err := conn.GetRules(tbl.table, tbl.chain(chain))
	if err != nil {
		t.Fatalf("list rules of %s: %v", chain, err)
	}
	for _, r := range rules {
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Verdict:
				if k, ok := chainOf[e.Chain]; ok {
					jumps = append(jumps, k.String())
				}
			case *expr.Objref:
				for k := range tbl.applied {
					if _, dropped := CounterNames(k); dropped == e.Name {
						counted = append(counted, k.String())
					}
				}
			}
		}
	}
	return jumps, counted
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
