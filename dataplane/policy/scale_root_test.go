package policy

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/roottest"
)

// scalePods are pods i in [from, to) as the benchmark makes them: 100
// namespaces over 50 nodes, an address per family, a named port http.
func scalePods(t testing.TB, from, to int) []*cluster.Pod {
	var out []*cluster.Pod
	for i := range to - from {
		p, err := convert.FromV1Pod(apiPod(from + i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// scalePolicies select node0's pods of ns0 and take every pod of the
// cluster as a peer (ingress), as a named-port destination (egress), and an
// ipBlock per family less 2,000 excepts (an interval set of ~4,000
// elements).
func scalePolicies(t testing.TB) []*cluster.NetworkPolicy {
	var ex4, ex6 []string
	for i := range 2000 {
		ex4 = append(ex4, fmt.Sprintf("10.1.%d.%d/32", i/250, i%250+1))
		ex6 = append(ex6, fmt.Sprintf("\"2001:db8::%x/128\"", 2*i+1))
	}
	return mustPolicies(t, `
metadata: {namespace: ns0, name: from-all}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}}]}]`, `
metadata: {namespace: ns0, name: to-all-http}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {}}], ports: [{port: http}]}]`, fmt.Sprintf(`
metadata: {namespace: ns0, name: blocks}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [%s]}}, {ipBlock: {cidr: "2001:db8::/64", except: [%s]}}]}]`,
		strings.Join(ex4, ", "), strings.Join(ex6, ", ")))
}

// TestRealKernelSetsAtScale: sets of 5,000 and more pods outgrow one
// netlink attribute (5,000 IPv6 peers are ~180 KiB of elements, an
// attribute's length is 16 bits). A first full apply, one after a restart
// (a new Table over the old table), an incremental one adding 2,500 pods
// and one removing them each leave every set holding what the program says,
// read back from the kernel.
func TestRealKernelSetsAtScale(t *testing.T) {
	_, h := roottest.NetNS(t, "podnet-polscale")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())), nftmsg.Buffers())
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Families: ipfamily.All, LogGroup: 24}
	tbl := NewTable(conn, opts)
	t.Cleanup(func() { tbl.Remove() })
	nss := scaleNamespaces()
	pols := scalePolicies(t)
	base := scalePods(t, 0, 5000)
	compile := func(pods []*cluster.Pod) *Program { return NewModel(pods, nss, pols).Compile(onNode("node0")) }
	apply := func(step string, prog *Program) {
		t.Helper()
		if err := tbl.Apply(prog); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		kernelHolds(t, step, conn, tbl)
	}
	apply("first apply", compile(base))
	tbl = NewTable(conn, opts)
	apply("after a restart", compile(base))
	more := append(slices.Clone(base), scalePods(t, 5000, 7500)...)
	apply("2,500 pods more", compile(more))
	apply("2,500 pods fewer", compile(base))
}

func scaleNamespaces() []*cluster.Namespace {
	var nss []*cluster.Namespace
	for n := range 100 {
		nss = append(nss, &cluster.Namespace{Name: fmt.Sprintf("ns%d", n)})
	}
	return nss
}

// kernelHolds compares every set of the applied policies, and the isolated
// sets, with the kernel's.
func kernelHolds(t *testing.T, step string, conn *nftables.Conn, tbl *Table) {
	t.Helper()
	if kernelSetsHold(t, step, conn, tbl) < 5000 {
		t.Fatalf("%s: no set of 5,000 elements or more: the test proves nothing", step)
	}
}

// kernelSetsHold compares every set of the applied program with the
// kernel's and returns the size of the largest.
func kernelSetsHold(t *testing.T, step string, conn *nftables.Conn, tbl *Table) int {
	t.Helper()
	want := tableSets(tbl)
	big := 0
	sets, err := conn.GetSets(tbl.table)
	if err != nil {
		t.Fatalf("%s: list sets: %v", step, err)
	}
	if len(sets) != len(want) {
		t.Errorf("%s: the table has %d sets, want %d", step, len(sets), len(want))
	}
	for name, elems := range want {
		i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == name })
		if i < 0 {
			t.Fatalf("%s: no set %s", step, name)
		}
		got, err := conn.GetSetElements(sets[i])
		if err != nil {
			t.Fatalf("%s: read set %s: %v", step, name, err)
		}
		if g, w := elemKeys(got), elemKeys(elems); !slices.Equal(g, w) {
			t.Errorf("%s: set %s holds %d elements, want %d (%s)", step, name, len(g), len(w), firstDiff(g, w))
		}
		big = max(big, len(elems))
	}
	return big
}

// tableSets is every set of the applied program and what it should hold:
// the shared peers and named ports, the ipBlocks and the verdict maps.
func tableSets(tbl *Table) map[string][]nftables.SetElement {
	want := map[string][]nftables.SetElement{}
	for _, f := range tbl.opts.Families {
		want[peersSet(f)], want[namedSet(f)] = nil, nil
		for _, ps := range tbl.peers {
			want[peersSet(f)] = append(want[peersSet(f)], idElems(f, uint32(ps.id), ps.addrs)...)
		}
		for d := range dirNames {
			want[vmapName(Direction(d), f)] = nil
			for a, g := range tbl.addrGroup[d] {
				if f.Has(a) {
					want[vmapName(Direction(d), f)] = append(want[vmapName(Direction(d), f)], nftables.SetElement{Key: a.AsSlice(),
						VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: g.chainName(Direction(d))}})
				}
			}
		}
	}
	for _, inst := range tbl.applied {
		for d, dir := range inst.prog.Dir {
			for i, r := range dir.Rules {
				for _, f := range tbl.opts.Families {
					if !dir.Applies {
						continue
					}
					if r.HasNamed {
						want[namedSet(f)] = append(want[namedSet(f)], namedElems(f, inst.named[d][i], r.Named)...)
					}
					if blocks := rangeElems(f, r.Blocks); len(blocks) > 0 {
						want[blocksSetName(inst.id, Direction(d), i, f)] = blocks
					}
				}
			}
		}
	}
	return want
}

func elemKeys(es []nftables.SetElement) []string {
	var out []string
	for _, e := range es {
		s := fmt.Sprintf("%x/%v", e.Key, e.IntervalEnd)
		if v := elemVerdict(e); v != nil {
			s += fmt.Sprintf("/%v %s", v.Kind, v.Chain)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// elemVerdict is a verdict map element's verdict: the one it was written
// with, or the one read back (which the library leaves as the raw
// NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN attributes in Val).
func elemVerdict(e nftables.SetElement) *expr.Verdict {
	if e.VerdictData != nil || len(e.Val) == 0 {
		return e.VerdictData
	}
	ad, err := netlink.NewAttributeDecoder(e.Val)
	if err != nil {
		return &expr.Verdict{Chain: "undecodable: " + err.Error()}
	}
	ad.ByteOrder = binary.BigEndian
	v := &expr.Verdict{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(ad.Uint32()))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	return v
}

func firstDiff(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference: %s, want %s", got[i], want[i])
		}
	}
	return "one is a prefix of the other"
}

// BenchmarkEnforce is one change to enforcement on node1, at the
// benchmark's 1,000 policies over 5,000 pods: the program's update and the
// Table's transaction into the kernel of a network namespace of its own.
// Incremental* go through the Compiler; FullCompile* compile the whole
// model for each change as proxyd did before, side by side. p95-ms is the
// 95th percentile of the iterations, p95-cpu-ms that of the CPU time the
// process spent in them (on a loaded machine the wall time is mostly
// waiting for a core).
func BenchmarkEnforce(b *testing.B) {
	_, h := roottest.NetNS(b, "podnet-polbench")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())), nftmsg.Buffers())
	if err != nil {
		b.Fatal(err)
	}
	tbl := NewTable(conn, Options{Families: ipfamily.All, LogGroup: 24})
	b.Cleanup(func() { tbl.Remove() })
	pods, nss, pols := benchWorld(b)
	added, relabelled := benchChanges(b, pods)
	for _, bc := range []struct {
		name   string
		change func(int, *Compiler)
		full   bool
	}{{"IncrementalPodAdded", added, false}, {"IncrementalLabelChanged", relabelled, false},
		{"FullCompilePodAdded", added, true}, {"FullCompileLabelChanged", relabelled, true}} {
		b.Run(bc.name, func(b *testing.B) {
			c := NewCompiler(NewModel(pods, nss, pols), onNode("node1"))
			if err := tbl.Apply(c.Program()); err != nil {
				b.Fatal(err)
			}
			var took, cpu []time.Duration
			b.ResetTimer()
			for i := range b.N {
				start, startCPU := time.Now(), cpuTime(b)
				bc.change(i, c)
				prog := c.Program()
				if bc.full {
					prog = c.Model().Compile(onNode("node1"))
				}
				if err := tbl.Apply(prog); err != nil {
					b.Fatal(err)
				}
				took, cpu = append(took, time.Since(start)), append(cpu, cpuTime(b)-startCPU)
			}
			slices.Sort(took)
			slices.Sort(cpu)
			b.ReportMetric(float64(took[len(took)*95/100])/float64(time.Millisecond), "p95-ms")
			b.ReportMetric(float64(cpu[len(cpu)*95/100])/float64(time.Millisecond), "p95-cpu-ms")
		})
	}
}
