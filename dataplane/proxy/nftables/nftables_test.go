package nftables_test

import (
	"errors"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
)

// defaultCfg has 4 endpoint maps, so the golden tables stay short and
// targets share maps.
var defaultCfg = nftables.Config{Family: ipfamily.IPv4, ClusterCIDR: proxytest.ClusterCIDR, Shards: 4}

func apply(t *testing.T, f *nftables.Fake, cfg nftables.Config, ports map[cluster.Key][]*proxy.ServicePort) *nftables.Proxier {
	t.Helper()
	p := nftables.NewProxier(cfg, f)
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return p
}

// TestGoldenTable: the table the scenario writes, as the Fake holds it,
// and the same as Generate's.
func TestGoldenTable(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	got := f.Table(ipfamily.IPv4).String()
	proxytest.Golden(t, "scenario.golden", []byte(got))
	if want := defaultCfg.Generate(proxytest.Scenario()).String(); got != want {
		t.Errorf("the Fake holds another table than Generate's:\n%s", proxytest.Diff(want, got))
	}
}

func TestTrace(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	proxytest.CheckTraces(t, func(p proxytest.TracePacket) proxytest.Traced {
		return traced(f.Trace(nftables.Packet(p), proxytest.LocalAddrs))
	})
}

func traced(tr nftables.Trace) proxytest.Traced {
	return proxytest.Traced{Endpoints: tr.Endpoints, Masquerade: tr.Masquerade, Verdict: tr.Verdict}
}

// affinityTarget is the id of the target whose affinity lasts timeout
// (the only one in the table).
func affinityTarget(t *testing.T, tbl *nftables.Table, timeout time.Duration) uint64 {
	t.Helper()
	var ids []uint64
	for _, c := range tbl.Chains {
		for _, r := range c.Rules {
			for _, s := range r.Do {
				if s.Kind == nftables.StmtDNATAffinity && s.Timeout == timeout && !slices.Contains(ids, s.ID) {
					ids = append(ids, s.ID)
				}
			}
		}
	}
	if len(ids) != 1 {
		t.Fatalf("targets with an affinity of %v: %x, want one", timeout, ids)
	}
	return ids[0]
}

func checkTrace(t *testing.T, tr nftables.Trace, eps, masqWant []string, verdict string) {
	t.Helper()
	proxytest.CheckTrace(t, traced(tr), eps, masqWant, verdict)
}

// TestAffinityFollowsTheClient: a client the affinity map holds goes back
// to its endpoint.
func TestAffinityFollowsTheClient(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	id := affinityTarget(t, f.Table(ipfamily.IPv4), 3*time.Hour)
	to := netip.AddrPortFrom(proxytest.RemotePod, 8080)
	f.AddAffinity("affinity-ip4", nftables.Elem{Key: []nftables.Value{{ID: id}, {Addr: proxytest.ClientPod}}, To: to})
	tr := f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.90"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs)
	if !slices.Equal(tr.Endpoints, []string{to.String()}) {
		t.Errorf("client with affinity reached %v, want only %v", tr.Endpoints, to)
	}
}

func TestMasqueradeAllAndNodePortAddresses(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, nftables.Config{Family: ipfamily.IPv4, ClusterCIDR: proxytest.ClusterCIDR, MasqueradeAll: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}}, proxytest.Scenario())
	tr := f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.20"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 2 || !tr.Masquerade[tr.Endpoints[0]] || !tr.Masquerade[tr.Endpoints[1]] {
		t.Errorf("masquerade-all: pod traffic not masqueraded: %+v", tr)
	}
	// 10.244.1.1 is local but outside --nodeport-addresses.
	tr = f.Trace(nftables.Packet{Src: proxytest.Outsider, Dst: proxytest.A("10.244.1.1"), Proto: "tcp", DPort: 30080}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 0 {
		t.Errorf("NodePort answered on an address outside --nodeport-addresses: %v", tr.Endpoints)
	}
	tr = f.Trace(nftables.Packet{Src: proxytest.Outsider, Dst: proxytest.NodeIP, Proto: "tcp", DPort: 30080}, proxytest.LocalAddrs)
	if len(tr.Endpoints) != 2 {
		t.Errorf("NodePort on the node IP: endpoints %v, want 2", tr.Endpoints)
	}
}

// TestIPv6 runs the same layout for IPv6 in the same table, beside IPv4.
func TestIPv6(t *testing.T) {
	pod6, remote6, client6 := proxytest.A("fd00:10:244:1::5"), proxytest.A("fd00:10:244:2::7"), proxytest.A("fd00:10:244:1::9")
	web := &cluster.Service{Namespace: "default", Name: "web", Type: cluster.ServiceTypeNodePort,
		ClusterIPs: []netip.Addr{proxytest.A("fd00:10:96::20")}, Ports: []cluster.ServicePort{proxytest.TCP(80, 30080)}}
	eps := proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(pod6, proxytest.NodeName, true), proxytest.EP(remote6, "node-b", true))
	empty := &cluster.Service{Namespace: "default", Name: "empty", Type: cluster.ServiceTypeClusterIP,
		ClusterIPs: []netip.Addr{proxytest.A("fd00:10:96::30")}, Ports: []cluster.ServicePort{proxytest.TCP(80, 0)}}
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	cfg6 := nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56"), Shards: 4}
	apply(t, f, cfg6, proxytest.WorldOf(ipfamily.IPv6, web, eps, empty))
	node6 := proxytest.A("fd00:192:168:10::11")
	local := append(slices.Clone(proxytest.LocalAddrs), node6, proxytest.A("::1"))
	want := []string{"[fd00:10:244:1::5]:8080", "[fd00:10:244:2::7]:8080"}
	checkTrace(t, f.Trace(nftables.Packet{Src: client6, Dst: proxytest.A("fd00:10:96::20"), Proto: "tcp", DPort: 80}, local), want, nil, "accept")
	checkTrace(t, f.Trace(nftables.Packet{Src: proxytest.A("fd00:192:168:20::5"), Dst: node6, Proto: "tcp", DPort: 30080}, local), want, want, "accept")
	checkTrace(t, f.Trace(nftables.Packet{Src: client6, Dst: proxytest.A("fd00:10:96::30"), Proto: "tcp", DPort: 80}, local), nil, nil, "reject")
	checkTrace(t, f.Trace(nftables.Packet{Src: proxytest.A("::1"), Dst: proxytest.A("::1"), Proto: "tcp", DPort: 30080, FromHost: true}, local), nil, nil, "accept")
	// IPv4 is untouched by the IPv6 Proxier.
	if got, want := f.Table(ipfamily.IPv4).String(), defaultCfg.Generate(proxytest.Scenario()).String(); got != want {
		t.Errorf("IPv4 objects changed by the IPv6 sync:\n%s", proxytest.Diff(want, got))
	}
	proxytest.Golden(t, "ipv6.golden", []byte(f.Table(ipfamily.IPv6).String()))
}

// mutate changes one random Service of ports the way the cluster does:
// endpoints come and go, a port changes, a Service leaves or arrives.
func mutations() []func() map[cluster.Key][]*proxy.ServicePort {
	base := func(eps ...proxytest.Endpoint) map[cluster.Key][]*proxy.ServicePort {
		web := proxytest.Svc("web", "10.96.0.20", []cluster.ServicePort{proxytest.TCP(80, 30020)}, func(s *cluster.Service) { s.Type = cluster.ServiceTypeNodePort })
		sticky := proxytest.Svc("sticky", "10.96.0.90", []cluster.ServicePort{proxytest.TCP(80, 0)}, func(s *cluster.Service) { s.SessionAffinityTimeout = time.Hour })
		objs := []cluster.Object{web, sticky}
		if len(eps) > 0 {
			objs = append(objs, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, eps...),
				proxytest.Slice(sticky, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, eps...))
		}
		return proxytest.World(objs...)
	}
	merge := func(ms ...map[cluster.Key][]*proxy.ServicePort) map[cluster.Key][]*proxy.ServicePort {
		out := map[cluster.Key][]*proxy.ServicePort{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	l, r, r2 := proxytest.EP(proxytest.LocalPod, proxytest.NodeName, true), proxytest.EP(proxytest.RemotePod, "node-b", true), proxytest.EP(proxytest.A("10.244.3.3"), "node-c", true)
	return []func() map[cluster.Key][]*proxy.ServicePort{
		func() map[cluster.Key][]*proxy.ServicePort { return proxytest.Scenario() },
		func() map[cluster.Key][]*proxy.ServicePort { return base(l, r) },
		func() map[cluster.Key][]*proxy.ServicePort { return base(r) },
		func() map[cluster.Key][]*proxy.ServicePort { return base(r, r2) },
		func() map[cluster.Key][]*proxy.ServicePort { return base() },
		func() map[cluster.Key][]*proxy.ServicePort { return merge(proxytest.Scenario(), base(l, r2)) },
		func() map[cluster.Key][]*proxy.ServicePort { return merge(proxytest.Scenario(), base(r)) },
		func() map[cluster.Key][]*proxy.ServicePort { return map[cluster.Key][]*proxy.ServicePort{} },
	}
}

// TestPartialSyncEqualsFull: after any sequence of states, partial syncs
// leave the table a full sync would write; the Fake refuses any
// transaction the kernel would.
func TestPartialSyncEqualsFull(t *testing.T) {
	states := mutations()
	rng := rand.New(rand.NewPCG(1, 2))
	f := nftables.NewFake()
	// One map, updated in place between syncs, as the proxy's syncer
	// hands it.
	ports := states[0]()
	p := apply(t, f, defaultCfg, ports)
	for i := range 200 {
		next := states[rng.IntN(len(states))]()
		// Every other step names the Services that may have changed
		// (those before and after), as the syncer does; the others
		// leave the Proxier to compare them all.
		var changed map[cluster.Key]bool
		if i%2 == 1 {
			changed = map[cluster.Key]bool{}
			for k := range ports {
				changed[k] = true
			}
			for k := range next {
				changed[k] = true
			}
		}
		maps.DeleteFunc(ports, func(cluster.Key, []*proxy.ServicePort) bool { return true })
		maps.Copy(ports, next)
		if _, err := p.Sync(ports, changed, false); err != nil {
			t.Fatalf("step %d: partial sync: %v", i, err)
		}
		got, want := f.Table(ipfamily.IPv4).String(), defaultCfg.Generate(ports).String()
		if got != want {
			t.Fatalf("step %d: partial sync left another table than a full one:\n%s", i, proxytest.Diff(want, got))
		}
	}
}

// TestEndpointChangeIsElementUpdates: endpoints replaced are element
// updates in one transaction, no chain touched; one added rewrites the
// port's DNAT rule (numgen's modulus) beside the elements.
func TestEndpointChangeIsElementUpdates(t *testing.T) {
	ms := mutations()
	f := nftables.NewFake()
	p := apply(t, f, defaultCfg, ms[1]()) // web and sticky: a local and a remote endpoint
	before := f.Applied
	if _, err := p.Sync(ms[3](), nil, false); err != nil { // two remote endpoints
		t.Fatal(err)
	}
	if f.Applied != before+1 {
		t.Errorf("%d transactions, want 1", f.Applied-before)
	}
	for _, op := range f.Last {
		if op.Kind != nftables.OpAddElems && op.Kind != nftables.OpDelElems && op.Kind != nftables.OpFlushSet {
			t.Errorf("endpoints replaced: step %d on %v%v, want element updates only", op.Kind, op.Chain, op.Set)
		}
	}
	if f.Ops > 10 {
		t.Errorf("endpoints of two Services replaced in %d steps, want a few", f.Ops)
	}
	before = f.Applied
	if _, err := p.Sync(ms[3](), nil, false); err != nil {
		t.Fatal(err)
	}
	if f.Applied != before {
		t.Errorf("a sync without changes ran a transaction")
	}
}

// TestFailedTransactionMakesTheNextFull: after a failure nothing is
// assumed of the kernel.
func TestFailedTransactionMakesTheNextFull(t *testing.T) {
	ms := mutations()
	f := nftables.NewFake()
	p := apply(t, f, defaultCfg, ms[1]())
	f.FailNext = syscall.ENOBUFS
	if _, err := p.Sync(ms[2](), nil, false); !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("sync = %v, want the transaction's error", err)
	}
	if got, want := f.Table(ipfamily.IPv4).String(), defaultCfg.Generate(ms[1]()).String(); got != want {
		t.Fatalf("a failed transaction changed the table:\n%s", proxytest.Diff(want, got))
	}
	if _, err := p.Sync(ms[2](), nil, false); err != nil {
		t.Fatal(err)
	}
	if got, want := f.Table(ipfamily.IPv4).String(), defaultCfg.Generate(ms[2]()).String(); got != want {
		t.Fatalf("the sync after a failure:\n%s", proxytest.Diff(want, got))
	}
}

// TestRestartKeepsAffinityAndDeletesLeftovers: a new Proxier (proxyd
// restarted) finds the table, removes what is no longer wanted and keeps
// the clients of the affinity maps.
func TestRestartKeepsAffinityAndDeletesLeftovers(t *testing.T) {
	ms := mutations()
	f := nftables.NewFake()
	apply(t, f, defaultCfg, ms[5]())
	aff := "affinity-ip4"
	id := affinityTarget(t, f.Table(ipfamily.IPv4), time.Hour)
	client := nftables.Elem{Key: []nftables.Value{{ID: id}, {Addr: proxytest.ClientPod}}, To: netip.AddrPortFrom(proxytest.LocalPod, 8080)}
	f.AddAffinity(aff, client)
	apply(t, f, defaultCfg, ms[1]())
	got := f.Table(ipfamily.IPv4)
	if s := got.Sets[aff]; s == nil || len(s.Elems) != 1 {
		t.Errorf("affinity map after a restart: %+v, want the client kept", s)
	}
	got.Sets[aff].Elems = nil
	if want := defaultCfg.Generate(ms[1]()).String(); got.String() != want {
		t.Errorf("after a restart:\n%s", proxytest.Diff(want, got.String()))
	}
}

// TestFakeFailsLikeTheKernel: the Fake refuses what the kernel refuses,
// and a refused transaction changes nothing.
func TestFakeFailsLikeTheKernel(t *testing.T) {
	f := nftables.NewFake()
	chain := &nftables.Chain{Name: "c-ip4"}
	set := &nftables.Set{Name: "s-ip4", Key: []nftables.Type{nftables.TypeAddr}}
	vmap := &nftables.Set{Name: "v-ip4", Key: []nftables.Type{nftables.TypeAddr}, Data: []nftables.Type{nftables.TypeVerdict}}
	for _, tc := range []struct {
		name string
		ops  []nftables.Op
		want error
	}{
		{"no table", []nftables.Op{{Kind: nftables.OpAddChain, Chain: chain}}, syscall.ENOENT},
		{"rule in a missing chain", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddRule, Chain: chain}}, syscall.ENOENT},
		{"jump to a missing chain", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddChain, Chain: chain},
			{Kind: nftables.OpAddRule, Chain: chain, Rule: nftables.Rule{Do: []nftables.Stmt{{Kind: nftables.StmtJump, Chain: "x"}}}}}, syscall.ENOENT},
		{"lookup of a set of another type", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddChain, Chain: chain}, {Kind: nftables.OpAddSet, Set: set},
			{Kind: nftables.OpAddRule, Chain: chain, Rule: nftables.Rule{Do: []nftables.Stmt{{Kind: nftables.StmtVmap, Key: []nftables.Field{nftables.FieldDaddr}, Map: set.Name}}}}}, nil},
		{"element pointing at a missing chain", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddSet, Set: vmap},
			{Kind: nftables.OpAddElems, Set: vmap, Elems: []nftables.Elem{{Key: []nftables.Value{{Addr: proxytest.ClientPod}}, Goto: "x"}}}}, syscall.ENOENT},
		{"chain deleted while an element points at it", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddChain, Chain: chain}, {Kind: nftables.OpAddSet, Set: vmap},
			{Kind: nftables.OpAddElems, Set: vmap, Elems: []nftables.Elem{{Key: []nftables.Value{{Addr: proxytest.ClientPod}}, Goto: chain.Name}}},
			{Kind: nftables.OpDelChain, Chain: chain}}, syscall.EBUSY},
		{"an element twice with two values", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddChain, Chain: chain}, {Kind: nftables.OpAddChain, Chain: &nftables.Chain{Name: "d-ip4"}},
			{Kind: nftables.OpAddSet, Set: vmap},
			{Kind: nftables.OpAddElems, Set: vmap, Elems: []nftables.Elem{{Key: []nftables.Value{{Addr: proxytest.ClientPod}}, Goto: chain.Name}}},
			{Kind: nftables.OpAddElems, Set: vmap, Elems: []nftables.Elem{{Key: []nftables.Value{{Addr: proxytest.ClientPod}}, Goto: "d-ip4"}}}}, syscall.EEXIST},
		{"a missing element deleted", []nftables.Op{{Kind: nftables.OpAddTable}, {Kind: nftables.OpAddSet, Set: set},
			{Kind: nftables.OpDelElems, Set: set, Elems: []nftables.Elem{{Key: []nftables.Value{{Addr: proxytest.ClientPod}}}}}}, syscall.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := f.Apply(tc.ops)
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Apply = %v, want %v", err, tc.want)
			}
			if f.Exists() {
				t.Errorf("a refused transaction created the table")
			}
		})
	}
}

// TestProgrammed: the table read back names each frontend's endpoints,
// what proxyd status compares with its report.
func TestProgrammed(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	p := nftables.ProgrammedOf(f.Table(ipfamily.IPv4))
	got := map[string]string{}
	for _, fe := range p.Frontends {
		v := strings.Join(fe.Endpoints, " ")
		if fe.Reject {
			v = "reject"
		}
		got[fe.Address+"/"+fe.Protocol] = v
	}
	both := proxytest.LocalPod.String() + ":8080 " + proxytest.RemotePod.String() + ":8080"
	for fe, want := range map[string]string{
		"10.96.0.20:80/TCP": both, "10.96.0.10:53/UDP": proxytest.RemotePod.String() + ":5353", ":30080/TCP": both,
		"192.168.30.1:80/TCP": both, ":30060/TCP": both, "10.96.0.30:80/TCP": "reject", ":30031/TCP": "reject",
		"10.96.0.80:80/TCP": proxytest.LocalPod.String() + ":8080",
	} {
		if got[fe] != want {
			t.Errorf("%s: %q, want %q", fe, got[fe], want)
		}
	}
	if _, ok := got["10.96.0.99:80/TCP"]; ok || len(p.Problems) > 0 {
		t.Errorf("another proxy's Service in the table, or problems: %v", p.Problems)
	}
}

// TestFirewall: the node firewall in the table masquerades pod traffic
// leaving the cluster, not pod to pod; Ensure writes only when something
// differs; Remove leaves the Service proxy's objects.
func TestFirewall(t *testing.T) {
	f := nftables.NewFake()
	apply(t, f, defaultCfg, proxytest.Scenario())
	fw := &nftables.Firewall{Family: ipfamily.IPv4, Kernel: f}
	rules := hostnet.Rules{ClusterCIDR: proxytest.ClusterCIDR, Masquerade: true}
	if changed, err := fw.Ensure(rules); err != nil || !changed {
		t.Fatalf("first Ensure: %v, %v", changed, err)
	}
	if changed, err := fw.Ensure(rules); err != nil || changed {
		t.Errorf("second Ensure of the same: %v, %v; want nothing written", changed, err)
	}
	out := f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("192.0.2.1"), Proto: "tcp", DPort: 443}, proxytest.LocalAddrs)
	if !out.Masquerade[""] {
		t.Errorf("pod to outside: %+v, want masqueraded", out)
	}
	toPod := f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.RemotePod, Proto: "tcp", DPort: 8080}, proxytest.LocalAddrs)
	if toPod.Masquerade[""] {
		t.Errorf("pod to pod: %+v, want its source kept", toPod)
	}
	if err := fw.Remove(); err != nil {
		t.Fatal(err)
	}
	if got, want := f.Table(ipfamily.IPv4).String(), defaultCfg.Generate(proxytest.Scenario()).String(); got != want {
		t.Errorf("after Remove, the Service proxy's objects changed:\n%s", proxytest.Diff(want, got))
	}
	if changed, err := fw.Ensure(rules); err != nil || !changed {
		t.Errorf("Ensure after Remove: %v, %v; want written again", changed, err)
	}
	// A full sync of the Service proxy leaves the firewall's chains.
	apply(t, f, defaultCfg, proxytest.Scenario())
	if out := f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("192.0.2.1"), Proto: "tcp", DPort: 443}, proxytest.LocalAddrs); !out.Masquerade[""] {
		t.Errorf("after a Service proxy full sync, pod to outside: %+v, want masqueraded", out)
	}
}

// TestAffinityKeptWhenAnotherEndpointLeaves: a partial sync taking away an
// endpoint leaves the affinity map alone, a client of another endpoint
// stays with it, and a client whose endpoint left is traced to the others.
func TestAffinityKeptWhenAnotherEndpointLeaves(t *testing.T) {
	third := proxytest.A("10.244.2.8")
	sticky := proxytest.Svc("sticky", "10.96.0.90", []cluster.ServicePort{proxytest.TCP(80, 0)}, func(s *cluster.Service) { s.SessionAffinityTimeout = time.Hour })
	world := func(eps ...netip.Addr) map[cluster.Key][]*proxy.ServicePort {
		var e []proxytest.Endpoint
		for _, a := range eps {
			e = append(e, proxytest.EP(a, "node-b", true))
		}
		return proxytest.World(sticky, proxytest.Slice(sticky, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, e...))
	}
	f := nftables.NewFake()
	p := apply(t, f, defaultCfg, world(proxytest.LocalPod, proxytest.RemotePod, third))
	id := affinityTarget(t, f.Table(ipfamily.IPv4), time.Hour)
	mine := netip.AddrPortFrom(proxytest.RemotePod, 8080)
	f.AddAffinity("affinity-ip4", nftables.Elem{Key: []nftables.Value{{ID: id}, {Addr: proxytest.ClientPod}}, To: mine})
	trace := func() []string {
		return f.Trace(nftables.Packet{Src: proxytest.ClientPod, Dst: proxytest.A("10.96.0.90"), Proto: "tcp", DPort: 80}, proxytest.LocalAddrs).Endpoints
	}
	if _, err := p.Sync(world(proxytest.LocalPod, proxytest.RemotePod), nil, false); err != nil {
		t.Fatal(err)
	}
	if s := f.Table(ipfamily.IPv4).Sets["affinity-ip4"]; s == nil || len(s.Elems) != 1 {
		t.Errorf("affinity map after another endpoint left: %+v, want the client kept", s)
	}
	if got := trace(); !slices.Equal(got, []string{mine.String()}) {
		t.Errorf("another endpoint left: the client reaches %v, want only %v", got, mine)
	}
	if _, err := p.Sync(world(proxytest.LocalPod, third), nil, false); err != nil {
		t.Fatal(err)
	}
	if got, want := trace(), []string{netip.AddrPortFrom(proxytest.LocalPod, 8080).String(), netip.AddrPortFrom(third, 8080).String()}; !slices.Equal(got, want) {
		t.Errorf("its own endpoint left: the client reaches %v, want %v", got, want)
	}
}

// TestDualStackEndpointChangeLeavesTheOtherFamily: one Proxier per family
// behind proxy.PerFamily, as proxyd runs them, over dual-stack Services;
// an endpoint of one family changes: that family's Proxier writes the
// change, the other writes nothing, and each family's table then equals a
// fresh full sync's (PerFamily now updates the family maps it hands in
// place). The old code passed this too: the IPv6 Proxier was handed the
// Service, built its objects again and found nothing to write; what it
// no longer does is tested in proxy (TestPerFamilyHandsOnlyTheFamilysChanges).
func TestDualStackEndpointChangeLeavesTheOtherFamily(t *testing.T) {
	const n = 20
	st, state := proxytest.DualStackState(n, 3, true)
	cfg6 := nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56"), Shards: 4}
	f := nftables.NewFake()
	p4, p6 := nftables.NewProxier(defaultCfg, f), nftables.NewProxier(cfg6, f)
	pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: p4, ipfamily.IPv6: p6})
	if _, err := pf.Sync(state.Ports, nil, true); err != nil {
		t.Fatal(err)
	}
	changed := proxytest.ChangeOneEndpoint(st, state, n)
	if len(changed) != 1 {
		t.Fatalf("changed %v, want one Service", changed)
	}
	if _, err := pf.Sync(state.Ports, changed, false); err != nil {
		t.Fatal(err)
	}
	if p4.LastOps == 0 || p6.LastOps != 0 {
		t.Errorf("IPv4 endpoint change: IPv4 Proxier wrote %d steps, IPv6 %d; want some and none", p4.LastOps, p6.LastOps)
	}
	fresh := nftables.NewFake()
	pff := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: nftables.NewProxier(defaultCfg, fresh), ipfamily.IPv6: nftables.NewProxier(cfg6, fresh)})
	if _, err := pff.Sync(state.Ports, nil, true); err != nil {
		t.Fatal(err)
	}
	for _, fam := range ipfamily.All {
		if got, want := f.Table(fam).String(), fresh.Table(fam).String(); got != want {
			t.Errorf("%v table after the partial sync\n%s\nwant (full sync)\n%s", fam, got, want)
		}
	}
}
