package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
)

func onNode(name string) func(*cluster.Pod) bool {
	return func(p *cluster.Pod) bool { return p.NodeName == name }
}

// TestProgramAgreesWithModel traces every flow of the model's table through
// the compiled program.
func TestProgramAgreesWithModel(t *testing.T) {
	pods, nss := fixture()
	for _, tc := range modelCases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewModel(pods, nss, mustPolicies(t, tc.policies...))
			prog := m.Compile(onNode("node1"))
			for _, c := range tc.checks {
				if got := prog.Allows(c.flow()); got != c.allow {
					t.Errorf("%s -> %s %s/%d: program allows %v, model %v", c.src, c.dst, c.proto, c.port, got, c.allow)
				}
			}
		})
	}
}

// TestProgramLeavesOtherNodesPodsAlone: pods of other nodes are peers, never
// selected, so their traffic with no local end is not judged here.
func TestProgramLeavesOtherNodesPodsAlone(t *testing.T) {
	pods, nss := fixture()
	pols := mustPolicies(t, `
metadata: {namespace: a}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}`)
	prog := NewModel(pods, nss, pols).Compile(onNode("node2"))
	if len(prog.Policies) != 0 {
		t.Fatalf("node2 has no pods, got %d policies", len(prog.Policies))
	}
	if !prog.Allows(deny("b/client", "a/web", tcp, 80).flow()) {
		t.Error("node2 judged a flow between pods of node1")
	}
}

func TestBlockRanges(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
		want   string
	}{
		{"10.0.0.0/8", nil, "[{10.0.0.0 10.255.255.255}]"},
		{"10.0.0.0/24", []string{"10.0.0.128/25", "10.0.0.0/32"}, "[{10.0.0.1 10.0.0.127}]"},
		{"10.0.0.0/24", []string{"10.0.0.16/28"}, "[{10.0.0.0 10.0.0.15} {10.0.0.32 10.0.0.255}]"},
		{"0.0.0.0/0", []string{"0.0.0.0/1"}, "[{128.0.0.0 255.255.255.255}]"},
		{"fd00::/64", []string{"fd00::/65"}, "[{fd00::8000:0:0:0 fd00::ffff:ffff:ffff:ffff}]"},
	} {
		p := cluster.PolicyPeer{Block: netip.MustParsePrefix(tc.cidr)}
		for _, e := range tc.except {
			p.Except = append(p.Except, netip.MustParsePrefix(e))
		}
		if got := fmt.Sprint(blockRanges(p)); got != tc.want {
			t.Errorf("%s except %v = %s, want %s", tc.cidr, tc.except, got, tc.want)
		}
	}
}

func TestMergeRanges(t *testing.T) {
	r := func(a, b string) AddrRange { return AddrRange{netip.MustParseAddr(a), netip.MustParseAddr(b)} }
	got := mergeRanges([]AddrRange{
		r("10.0.0.5", "10.0.0.9"), r("10.0.0.0", "10.0.0.4"), r("10.0.0.20", "10.0.0.30"), r("10.0.0.25", "10.0.0.26"),
		r("fd00::1", "fd00::1"), r("fd00::2", "fd00::5"), r("255.255.255.0", "255.255.255.255"), r("255.255.255.255", "255.255.255.255"),
	})
	want := "[{10.0.0.0 10.0.0.9} {10.0.0.20 10.0.0.30} {255.255.255.0 255.255.255.255} {fd00::1 fd00::5}]"
	if fmt.Sprint(got) != want {
		t.Errorf("merged %v, want %s", got, want)
	}
}
