package iptables_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/iptables/iptablestest"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
)

func apply(t *testing.T, f *iptablestest.Fake, cfg iptables.Config, ports map[cluster.Key][]*proxy.ServicePort) *iptables.Proxier {
	t.Helper()
	p := iptables.NewProxier(cfg, f)
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return p
}

var defaultCfg = iptables.Config{ClusterCIDR: proxytest.ClusterCIDR}

func saveAll(t *testing.T, f *iptablestest.Fake) []byte {
	t.Helper()
	var out []byte
	for _, tb := range []string{"filter", "nat"} {
		b, err := f.Save(tb)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

func TestGoldenRules(t *testing.T) {
	f := iptablestest.New()
	apply(t, f, defaultCfg, proxytest.Scenario())
	proxytest.Golden(t, "scenario.golden", saveAll(t, f))
}

func TestTrace(t *testing.T) {
	f := iptablestest.New()
	apply(t, f, defaultCfg, proxytest.Scenario())
	proxytest.CheckTraces(t, func(p proxytest.TracePacket) proxytest.Traced {
		tr := f.Trace(iptablestest.Packet(p), proxytest.LocalAddrs)
		return proxytest.Traced{Endpoints: tr.Endpoints, Masquerade: tr.Masquerade, Verdict: tr.Verdict}
	})
}

func TestMasqueradeAllAndNodePortAddresses(t *testing.T) {
	f := iptablestest.New()
	apply(t, f, iptables.Config{ClusterCIDR: proxytest.ClusterCIDR, MasqueradeAll: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}}, proxytest.Scenario())
	tr := f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.20"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 2 || !tr.Masquerade[tr.Endpoints[0]] || !tr.Masquerade[tr.Endpoints[1]] {
		t.Errorf("masquerade-all: pod traffic not masqueraded: %+v", tr)
	}
	// 10.244.1.1 is local but outside --nodeport-addresses.
	tr = f.Trace(iptablestest.Packet{Src: proxytest.Outsider, Dst: proxytest.A("10.244.1.1"), Proto: "tcp", DPort: 30080}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 0 {
		t.Errorf("NodePort answered on an address outside --nodeport-addresses: %v", tr.Endpoints)
	}
	tr = f.Trace(iptablestest.Packet{Src: proxytest.Outsider, Dst: proxytest.NodeIP, Proto: "tcp", DPort: 30080}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 2 {
		t.Errorf("NodePort on the node IP: endpoints %v, want 2", tr.Endpoints)
	}
}

func TestFakeFailsLikeTheKernel(t *testing.T) {
	f := iptablestest.New()
	for _, bad := range []string{
		"*nat\n:A - [0:0]\n-A A -j MISSING\nCOMMIT\n",
		"*nat\n-A NOPE -j ACCEPT\nCOMMIT\n",
		"*nat\n:A - [0:0]\n-A A -j DROP\nCOMMIT\n",
		"*nat\n:A - [0:0]\n-A A -j DNAT --to-destination 1.2.3.4:80\nCOMMIT\n",
	} {
		if err := f.Restore([]byte(bad)); err == nil {
			t.Errorf("restore accepted %q", bad)
		}
	}
	if err := f.Restore([]byte("*nat\n:A - [0:0]\n:B - [0:0]\n-A A -j B\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore([]byte("*nat\n:B - [0:0]\n-X B\nCOMMIT\n")); err == nil {
		t.Error("deleted a chain that is still referenced")
	}
	if err := f.Restore([]byte("*nat\n:A - [0:0]\n:B - [0:0]\n-X B\n-X A\nCOMMIT\n")); err != nil {
		t.Errorf("flush and delete both: %v", err)
	}
	if c := f.Chains("nat"); slices.Contains(c, "A") || slices.Contains(c, "B") {
		t.Errorf("chains left: %v", c)
	}
}

// TestStates applies a sequence of states in order and in random orders;
// whatever the path, the kernel must end up holding exactly what a fresh
// full sync of the last state writes, and each partial sync must only
// write the chains that changed.
func TestStates(t *testing.T) {
	mk := func(n int, eps ...netip.Addr) *cluster.Service {
		return proxytest.Svc(fmt.Sprintf("s%d", n), fmt.Sprintf("10.96.%d.%d", n/200, n%200+1), []cluster.ServicePort{proxytest.TCP(80, 0)})
	}
	states := make([]map[cluster.Key][]*proxy.ServicePort, 0, 5)
	for step := range 5 {
		var objs []cluster.Object
		for n := range 40 + step*7 {
			s := mk(n)
			if n%5 == step%5 {
				s.Type = cluster.ServiceTypeNodePort
				s.Ports[0].NodePort = uint16(30000 + n)
			}
			e := []proxytest.Endpoint{proxytest.EP(proxytest.A(fmt.Sprintf("10.244.%d.%d", n%3+1, n%250+2)), fmt.Sprintf("node-%d", n%3), true)}
			if (n+step)%3 == 0 {
				e = append(e, proxytest.EP(proxytest.A(fmt.Sprintf("10.244.9.%d", step+2)), proxytest.NodeName, true))
			}
			if (n+step)%7 == 0 {
				e = nil
			}
			objs = append(objs, s, proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, e...))
		}
		states = append(states, proxytest.World(objs...))
	}
	want := func(i int) []byte {
		f := iptablestest.New()
		apply(t, f, defaultCfg, states[i])
		return saveAll(t, f)
	}
	orders := [][]int{{0, 1, 2, 3, 4}}
	r := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		orders = append(orders, r.Perm(len(states)))
	}
	for _, order := range orders {
		f := iptablestest.New()
		p := iptables.NewProxier(defaultCfg, f)
		for k, i := range order {
			before := f.Restores
			if _, err := p.Sync(states[i], nil, k == 0); err != nil {
				t.Fatalf("order %v step %d: %v", order, k, err)
			}
			if got, w := saveAll(t, f), want(i); string(got) != string(w) {
				t.Fatalf("order %v: after state %d the kernel differs from a fresh sync:\n%s", order, i, proxytest.Diff(string(w), string(got)))
			}
			if k > 0 && f.Restores != before+1 {
				t.Errorf("partial sync used %d restores, want 1", f.Restores-before)
			}
		}
	}
}

func TestPartialSyncRewritesOnlyChangedChains(t *testing.T) {
	var objs []cluster.Object
	for n := range 500 {
		s := proxytest.Svc(fmt.Sprintf("s%d", n), fmt.Sprintf("10.96.%d.%d", n/200, n%200+1), []cluster.ServicePort{proxytest.TCP(80, 0)})
		objs = append(objs, s, proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)},
			proxytest.EP(proxytest.A(fmt.Sprintf("10.244.2.%d", n%250+2)), "node-b", true)))
	}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	state := proxy.NewState(ipfamily.IPv4)
	state.Update(st, proxytest.NodeName, nil, true)
	f := iptablestest.New()
	p := iptables.NewProxier(defaultCfg, f)
	if _, err := p.Sync(state.Ports, nil, true); err != nil {
		t.Fatal(err)
	}
	full := len(f.Last)

	// One endpoint of one Service changes.
	es := proxytest.Slice(objs[2*123].(*cluster.Service), []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("10.244.3.3"), "node-c", true))
	st.Upsert(es)
	changed := state.Update(st, proxytest.NodeName, map[cluster.Key]bool{es.ServiceKey(): true}, false)
	if _, err := p.Sync(state.Ports, changed, false); err != nil {
		t.Fatal(err)
	}
	chains := strings.Count(string(f.Last), "\n:")
	if chains != 1 || !strings.Contains(string(f.Last), "10.244.3.3:8080") {
		t.Errorf("partial sync wrote %d chains (%d of %d bytes), want the one leaf:\n%s", chains, len(f.Last), full, f.Last)
	}
	tr := f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.124"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs)
	if !slices.Equal(tr.Endpoints, []string{"10.244.3.3:8080"}) {
		t.Errorf("after the change the Service reaches %v", tr.Endpoints)
	}

	// A failure forces the next sync to be full.
	st.Upsert(proxytest.Slice(objs[2*123].(*cluster.Service), []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("10.244.3.4"), "node-c", true)))
	changed = state.Update(st, proxytest.NodeName, map[cluster.Key]bool{es.ServiceKey(): true}, false)
	f.FailNext = true
	if _, err := p.Sync(state.Ports, changed, false); err == nil {
		t.Fatal("injected failure not reported")
	}
	if _, err := p.Sync(state.Ports, nil, false); err != nil {
		t.Fatal(err)
	}
	if len(f.Last) < full*9/10 {
		t.Errorf("sync after a failure wrote %d bytes, want a full sync (~%d)", len(f.Last), full)
	}

	// Someone flushes a leaf behind our back; the periodic full sync repairs it.
	var leaf string
	for _, c := range f.Chains("nat") {
		if strings.HasPrefix(c, "PODSVC-D-") && strings.Contains(strings.Join(f.Rules("nat", c), "\n"), "10.96.0.124/32") {
			leaf = c
		}
	}
	f.DeleteChainRules("nat", leaf)
	if tr := f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.124"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs); len(tr.Endpoints) != 0 {
		t.Fatalf("leaf %q not emptied", leaf)
	}
	if _, err := p.Sync(state.Ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if tr := f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.124"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs); !slices.Equal(tr.Endpoints, []string{"10.244.3.4:8080"}) {
		t.Errorf("full sync did not repair %s: %v", leaf, tr.Endpoints)
	}
}

// TestFirstPacketCost shows the dispatch tree: the rules a first packet
// meets grow with log(n), not n.
func TestFirstPacketCost(t *testing.T) {
	cost := func(n int) int {
		var objs []cluster.Object
		for i := range n {
			s := proxytest.Svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256), []cluster.ServicePort{proxytest.TCP(80, 0)})
			objs = append(objs, s, proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)},
				proxytest.EP(proxytest.A("10.244.2.2"), "node-b", true), proxytest.EP(proxytest.A("10.244.2.3"), "node-b", true)))
		}
		f := iptablestest.New()
		apply(t, f, defaultCfg, proxytest.World(objs...))
		worst := 0
		for i := 0; i < n; i += max(1, n/97) {
			dst := proxytest.A(fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256))
			tr := f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: dst, Proto: "tcp", DPort: 80}, proxytest.LocalAddrs)
			if len(tr.Endpoints) != 2 {
				t.Fatalf("n=%d: %s reaches %v", n, dst, tr.Endpoints)
			}
			worst = max(worst, tr.Rules)
		}
		return worst
	}
	small, big := cost(10), cost(10000)
	t.Logf("rules met by a first packet: %d at 10 Services, %d at 10,000", small, big)
	if big > 100 {
		t.Errorf("first packet meets %d rules at 10,000 Services; a linear list would be ~30,000, the tree should stay under 100", big)
	}
}

func TestRestartDeletesLeftoverChainsAndCleanup(t *testing.T) {
	f := iptablestest.New()
	apply(t, f, defaultCfg, proxytest.Scenario())
	if !slices.ContainsFunc(f.Chains("nat"), func(c string) bool { return strings.HasPrefix(c, "PODSVC-E-") }) {
		t.Fatal("scenario has no external chain")
	}
	// A new proxier (proxyd restarted) with only the web Service left.
	ports := proxytest.Scenario()
	for k := range ports {
		if k.Name != "web" {
			delete(ports, k)
		}
	}
	apply(t, f, defaultCfg, ports)
	for _, c := range f.Chains("nat") {
		if strings.HasPrefix(c, "PODSVC-E-") || strings.HasPrefix(c, "PODSVC-S-") {
			t.Errorf("leftover chain %s after restart", c)
		}
	}
	if n := strings.Count(string(saveAll(t, f)), iptables.JumpComment); n != len(iptables.Jumps) {
		t.Errorf("%d jumps from built-in chains, want %d", n, len(iptables.Jumps))
	}
	if err := iptables.Cleanup(f); err != nil {
		t.Fatal(err)
	}
	if s := string(saveAll(t, f)); strings.Contains(s, "PODSVC") {
		t.Errorf("cleanup left:\n%s", s)
	}
}

// TestJumpsStayFirst: a rule another program inserts above the proxy's jump
// (an ACCEPT for pod traffic in FORWARD) would let traffic the proxy rejects
// through; the next full sync moves the jumps back on top.
func TestJumpsStayFirst(t *testing.T) {
	f := iptablestest.New()
	p := apply(t, f, defaultCfg, proxytest.Scenario())
	f.InsertRule("filter", "FORWARD", 1, "-s 10.244.0.0/16 -j ACCEPT")
	pkt := iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.30"), Proto: "tcp", DPort: 80}
	if tr := f.Trace(pkt, proxytest.LocalAddrs); tr.Verdict != "ACCEPT" {
		t.Fatalf("foreign ACCEPT not in effect: %s", tr.Verdict)
	}
	if _, err := p.Sync(proxytest.Scenario(), nil, true); err != nil {
		t.Fatal(err)
	}
	if tr := f.Trace(pkt, proxytest.LocalAddrs); tr.Verdict != "REJECT" {
		t.Errorf("after a full sync a Service without endpoints is %s, want REJECT", tr.Verdict)
	}
	rules := f.Rules("filter", "FORWARD")
	if len(rules) != 3 || !strings.HasSuffix(rules[0], iptables.ChainFilter) || !strings.HasSuffix(rules[1], iptables.ChainForward) {
		t.Errorf("FORWARD = %q", rules)
	}
	// With the jumps in place, a full sync leaves them alone.
	if _, err := p.Sync(proxytest.Scenario(), nil, true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(f.Last), "\n-I ") || strings.Contains(string(f.Last), "\n-D ") {
		t.Errorf("full sync moved jumps that were in place:\n%s", f.Last)
	}
}

// BenchmarkFullSyncText is the Go side of a full sync at 10,000 Services ×
// 10 endpoints: rule generation and the iptables-restore input.
func BenchmarkFullSyncText(b *testing.B) {
	_, state := benchState(10000, 10)
	b.ResetTimer()
	for b.Loop() {
		rs := iptables.Generate(defaultCfg, state.Ports)
		iptables.RestoreData(nil, rs, true, nil)
	}
}

// BenchmarkPartialSyncText is the Go side of a sync after one endpoint of
// one Service changed, at 10,000 Services × 10 endpoints.
func BenchmarkPartialSyncText(b *testing.B) {
	st, state := benchState(10000, 10)
	g := iptables.NewGenerator(defaultCfg)
	prev := g.Generate(state.Ports)
	key := cluster.Key{Namespace: "default", Name: "s05000"}
	s := st.Service(key)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		st.Upsert(proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A(fmt.Sprintf("10.250.0.%d", i%200+1)), "node-c", true)))
		state.Update(st, proxytest.NodeName, map[cluster.Key]bool{key: true}, false)
		next := g.Generate(state.Ports)
		if len(iptables.RestoreData(prev, next, false, nil)) > 64<<10 {
			b.Fatal("partial sync text too long")
		}
		prev = next
	}
}

// TestIncrementalGenerate changes endpoints of random Services one sync at
// a time; the Generator's incremental result must equal a fresh generation
// every time.
func TestIncrementalGenerate(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var objs []cluster.Object
	var svcs []*cluster.Service
	for n := range 300 {
		s := proxytest.Svc(fmt.Sprintf("s%d", n), fmt.Sprintf("10.96.%d.%d", n/100, n%100+1), []cluster.ServicePort{proxytest.TCP(80, 0), proxytest.Port("dns", cluster.UDP, 53)})
		switch n % 6 {
		case 1:
			s.Type = cluster.ServiceTypeNodePort
			s.Ports[0].NodePort = uint16(30000 + n)
		case 2:
			s.ExternalIPs = []netip.Addr{proxytest.A(fmt.Sprintf("192.168.50.%d", n%250+1))}
		case 3:
			s.InternalTrafficPolicyLocal = true
		case 4:
			s.SessionAffinityTimeout = time.Minute
		}
		svcs = append(svcs, s)
		objs = append(objs, s)
	}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	state := proxy.NewState(ipfamily.IPv4)
	state.Update(st, proxytest.NodeName, nil, true)
	g := iptables.NewGenerator(defaultCfg)
	g.Generate(state.Ports)
	for step := range 60 {
		s := svcs[r.IntN(len(svcs))]
		var eps []proxytest.Endpoint
		for j := range r.IntN(4) {
			node := "node-b"
			if r.IntN(2) == 0 {
				node = proxytest.NodeName
			}
			eps = append(eps, proxytest.EP(proxytest.A(fmt.Sprintf("10.244.%d.%d", step%200+1, j+2)), node, r.IntN(5) > 0))
		}
		st.Upsert(proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080), proxytest.EPPort("dns", cluster.UDP, 5353)}, eps...))
		state.Update(st, proxytest.NodeName, map[cluster.Key]bool{s.Key(): true}, false)
		got := g.Generate(state.Ports)
		want := iptables.Generate(defaultCfg, state.Ports)
		if d := iptables.RestoreData(want, got, false, nil); len(d) != 0 || len(got["nat"]) != len(want["nat"]) {
			t.Fatalf("step %d (%s): incremental result differs from a fresh one:\n%s", step, s.Name, d)
		}
	}
}

// TestHairpinWithoutNodeName: a pod reaching itself through its Service is
// masqueraded when its slice omits proxytest.NodeName or names another node, decided
// from this node's podCIDR, for TCP and UDP alike. Before the fix the reply
// went pod-to-pod and the client, expecting the VIP, dropped it.
func TestHairpinWithoutNodeName(t *testing.T) {
	me := &cluster.Node{Name: proxytest.NodeName, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	for _, form := range []struct{ name, node string }{{"no proxytest.NodeName", ""}, {"another node's name", "node-b"}} {
		for _, proto := range []cluster.Protocol{cluster.TCP, cluster.UDP} {
			t.Run(form.name+"/"+string(proto), func(t *testing.T) {
				s := proxytest.Svc("self", "10.96.0.60", []cluster.ServicePort{proxytest.Port("p", proto, 80)})
				es := proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p", proto, 8080)}, proxytest.EP(proxytest.LocalPod, form.node, true))
				st := cluster.NewStore()
				st.Replace([]cluster.Kind{cluster.KindNode, cluster.KindService, cluster.KindEndpointSlice}, []cluster.Object{me, s, es})
				state := proxy.NewState(ipfamily.IPv4)
				state.Update(st, proxytest.NodeName, nil, true)
				f := iptablestest.New()
				apply(t, f, defaultCfg, state.Ports)
				tr := f.Trace(iptablestest.Packet{Src: proxytest.LocalPod, Dst: proxytest.A("10.96.0.60"), Proto: strings.ToLower(string(proto)), DPort: 80}, proxytest.LocalAddrs)
				want := proxytest.LocalPod.String() + ":8080"
				if !slices.Equal(tr.Endpoints, []string{want}) || !tr.Masquerade[want] {
					t.Errorf("pod to itself through its Service: endpoints %v, masquerade %v; want %s masqueraded", tr.Endpoints, tr.Masquerade, want)
				}
				// A pod of another node that is no endpoint is not masqueraded.
				tr = f.Trace(iptablestest.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.60"), Proto: strings.ToLower(string(proto)), DPort: 80}, proxytest.LocalAddrs)
				if tr.Masquerade[want] {
					t.Errorf("another pod to the Service was masqueraded: %+v", tr)
				}
			})
		}
	}
}
