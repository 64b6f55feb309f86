package ebpf

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
)

// view resolves the maps the way the programs read them and checks their
// invariants: every slot up to the count exists and names a backend of
// the frontend's service. It returns one line per frontend, sorted, with
// ids left out so two syncers' maps compare equal.
func view(t *testing.T, s *FakeTable[svcKey, svcVal], b *FakeTable[uint32, backend]) []string {
	t.Helper()
	if err := consistent(s, b, true); err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range s.Entries {
		if k.Slot != 0 {
			continue
		}
		var eps []string
		for i := 1; i <= int(v.Count); i++ {
			sk := k
			sk.Slot = uint16(i)
			be := b.Entries[s.Entries[sk].Id]
			eps = append(eps, netip.AddrPortFrom(addrFrom16(be.Addr), be16(be.Port)).String())
		}
		slices.Sort(eps)
		out = append(out, fmt.Sprintf("%s:%d/%d scope=%d flags=%d affinity=%d -> %s",
			addrFrom16(k.Addr), be16(k.Port), k.Proto, k.Scope, v.Flags, v.Affinity, strings.Join(eps, ",")))
	}
	slices.Sort(out)
	return out
}

// consistent checks what a reader relies on at any moment: the slots a
// frontend counts exist and their backends exist. With owned true (after a
// sync) the backends also belong to the frontend's service; between two
// writes a frontend moving to another service id (its traffic policy
// changed) may briefly name the new service's backends under the old id,
// which only makes an affinity lookup miss.
func consistent(s *FakeTable[svcKey, svcVal], b *FakeTable[uint32, backend], owned bool) error {
	for k, v := range s.Entries {
		if k.Slot != 0 {
			continue
		}
		for i := 1; i <= int(v.Count); i++ {
			sk := k
			sk.Slot = uint16(i)
			slot, ok := s.Entries[sk]
			if !ok {
				return fmt.Errorf("frontend %v counts %d slots, slot %d missing", addrFrom16(k.Addr), v.Count, i)
			}
			be, ok := b.Entries[slot.Id]
			if !ok {
				return fmt.Errorf("frontend %v slot %d names missing backend %d", addrFrom16(k.Addr), i, slot.Id)
			}
			if owned && be.Svc != v.Id {
				return fmt.Errorf("frontend %v slot %d: backend %d belongs to service %d, not %d", addrFrom16(k.Addr), i, slot.Id, be.Svc, v.Id)
			}
		}
	}
	return nil
}

// garbage lists entries nothing reaches: slots past a count or without a
// frontend, backends no slot names.
func garbage(s *FakeTable[svcKey, svcVal], b *FakeTable[uint32, backend]) []string {
	var out []string
	used := make(map[uint32]bool)
	for k, v := range s.Entries {
		if k.Slot == 0 {
			continue
		}
		fk := k
		fk.Slot = 0
		fe, ok := s.Entries[fk]
		if !ok || k.Slot > fe.Count {
			out = append(out, fmt.Sprintf("slot %v/%d", addrFrom16(k.Addr), k.Slot))
		}
		used[v.Id] = true
	}
	for id := range b.Entries {
		if !used[id] {
			out = append(out, fmt.Sprintf("backend %d", id))
		}
	}
	return out
}

func ep(ip string, port uint16, local bool) proxy.Endpoint {
	e := proxy.NewEndpoint(netip.MustParseAddr(ip), port)
	e.Ready, e.Serving, e.Local = true, true, local
	return e
}

func key(name string) cluster.Key { return cluster.Key{Namespace: "default", Name: name} }

func clusterIPPort(name, vip string, port uint16, proto cluster.Protocol, eps ...proxy.Endpoint) *proxy.ServicePort {
	return &proxy.ServicePort{
		Name:      proxy.PortName{Service: key(name), Port: "p", Protocol: proto},
		ClusterIP: netip.MustParseAddr(vip), Port: port, Protocol: proto,
		Endpoints: eps, ClusterEndpoints: eps, HasEndpoints: len(eps) > 0,
	}
}

func TestSyncLayout(t *testing.T) {
	maps, s, b := NewFakeMaps()
	sy := NewSyncer(maps, func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.168.10.11")}, nil })
	np := clusterIPPort("np", "10.96.0.20", 80, cluster.TCP, ep("10.244.1.5", 8080, true), ep("10.244.2.5", 8080, false))
	np.NodePort = 30080
	np.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.50")}
	np.ExternalPolicyLocal = true
	np.LocalEndpoints = np.ClusterEndpoints[:1]
	np.AffinityTimeout = 3 * time.Hour
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("a"):     {clusterIPPort("a", "10.96.0.10", 53, cluster.UDP, ep("10.244.1.2", 5353, true))},
		key("empty"): {clusterIPPort("empty", "10.96.0.11", 80, cluster.TCP)},
		key("np"):    {np},
	}
	res, err := sy.Sync(ports, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"10.96.0.10:53/17 scope=0 flags=0 affinity=0 -> 10.244.1.2:5353",
		"10.96.0.11:80/6 scope=0 flags=1 affinity=0 -> ",
		"10.96.0.20:80/6 scope=0 flags=2 affinity=10800 -> 10.244.1.5:8080,10.244.2.5:8080",
		"192.0.2.50:80/6 scope=0 flags=2 affinity=10800 -> 10.244.1.5:8080,10.244.2.5:8080",
		"192.0.2.50:80/6 scope=1 flags=10 affinity=10800 -> 10.244.1.5:8080",
		"invalid IP:30080/6 scope=0 flags=2 affinity=10800 -> 10.244.1.5:8080,10.244.2.5:8080",
		"invalid IP:30080/6 scope=1 flags=10 affinity=10800 -> 10.244.1.5:8080",
	}
	if got := view(t, s, b); !slices.Equal(got, want) {
		t.Errorf("maps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Rules["services"] != len(s.Entries) || res.Rules["backends"] != len(b.Entries) {
		t.Errorf("result %v; maps hold %d services, %d backends entries", res.Rules, len(s.Entries), len(b.Entries))
	}
	// Pods reach np's ClusterIP, external IP and NodePort through one
	// service id (all endpoints), clients from outside through another
	// (policy Local: the local one): 2+1 backends, and 1 for a.
	if len(b.Entries) != 4 {
		t.Errorf("%d backends, want 4 (one per service id and endpoint)", len(b.Entries))
	}
	if len(maps.NodeAddrs.(*FakeTable[nodeKey, uint8]).Entries) != 1 {
		t.Errorf("node addresses not written")
	}

	// A second sync of the same state writes nothing.
	s.Log, b.Log = nil, nil
	if _, err := sy.Sync(ports, map[cluster.Key]bool{key("a"): true, key("np"): true}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if len(s.Log)+len(b.Log) != 0 {
		t.Errorf("unchanged state rewrote %v %v", s.Log, b.Log)
	}

	// One endpoint added to one Service writes only that Service's
	// entries: a backend, a slot and the frontend.
	ports[key("a")] = []*proxy.ServicePort{clusterIPPort("a", "10.96.0.10", 53, cluster.UDP, ep("10.244.1.2", 5353, true), ep("10.244.2.2", 5353, false))}
	if _, err := sy.Sync(ports, map[cluster.Key]bool{key("a"): true}, false); err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, o := range b.Log {
		ops = append(ops, "backend "+o.Op)
	}
	for _, o := range s.Log {
		ops = append(ops, fmt.Sprintf("%s slot %d of %s", o.Op, o.Key.Slot, addrFrom16(o.Key.Addr)))
	}
	if want := []string{"backend put", "put slot 2 of 10.96.0.10", "put slot 0 of 10.96.0.10"}; !slices.Equal(ops, want) {
		t.Errorf("one endpoint added: %v, want %v", ops, want)
	}
}

// A restarted proxy finds the maps full: it adopts their ids, so a full
// sync of the same state writes nothing and affinity entries stay valid.
func TestSyncAdoptsKernelState(t *testing.T) {
	maps, s, b := NewFakeMaps()
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("a"): {clusterIPPort("a", "10.96.0.10", 80, cluster.TCP, ep("10.244.1.2", 80, true), ep("10.244.1.3", 80, true))},
		key("b"): {clusterIPPort("b", "10.96.0.11", 80, cluster.TCP, ep("10.244.1.4", 80, true))},
	}
	if _, err := NewSyncer(maps, nil).Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	before := view(t, s, b)
	s.Log, b.Log = nil, nil
	again := NewSyncer(maps, nil)
	if _, err := again.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if len(s.Log)+len(b.Log) != 0 {
		t.Errorf("restart rewrote %d service and %d backend entries, want none", len(s.Log), len(b.Log))
	}
	// New ids do not collide with adopted ones.
	ports[key("c")] = []*proxy.ServicePort{clusterIPPort("c", "10.96.0.12", 80, cluster.TCP, ep("10.244.1.9", 80, true))}
	if _, err := again.Sync(ports, map[cluster.Key]bool{key("c"): true}, false); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s, b); len(got) != len(before)+1 {
		t.Errorf("after adding c: %v", got)
	}
}

// A failed write (a full map) fails the sync; the next sync is full and
// ends with the same maps as a fresh load.
func TestSyncFailureThenFullRepair(t *testing.T) {
	maps, s, b := NewFakeMaps()
	b.Max = 2
	sy := NewSyncer(maps, nil)
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("a"): {clusterIPPort("a", "10.96.0.10", 80, cluster.TCP, ep("10.244.1.2", 80, true), ep("10.244.1.3", 80, true), ep("10.244.1.4", 80, true))},
	}
	if _, err := sy.Sync(ports, nil, true); err == nil {
		t.Fatal("sync into a full map succeeded")
	}
	b.Max = 100
	ports[key("a")] = []*proxy.ServicePort{clusterIPPort("a", "10.96.0.10", 80, cluster.TCP, ep("10.244.1.2", 80, true))}
	if _, err := sy.Sync(ports, map[cluster.Key]bool{key("a"): true}, false); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.96.0.10:80/6 scope=0 flags=0 affinity=0 -> 10.244.1.2:80"}
	if got := view(t, s, b); !slices.Equal(got, want) {
		t.Errorf("after repair: %v, want %v", got, want)
	}
	if g := garbage(s, b); len(g) > 0 {
		t.Errorf("left behind: %v", g)
	}
}

// Incremental syncs over a random history end where a full load of the
// final state ends, leave nothing unreachable behind, and never expose an
// inconsistent frontend between two single writes.
func TestIncrementalEqualsFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	maps, s, b := NewFakeMaps()
	check := func(string) {
		if err := consistent(s, b, false); err != nil {
			t.Fatal(err)
		}
	}
	s.OnChange, b.OnChange = check, check
	inc := NewSyncer(maps, nil)
	ports := make(map[cluster.Key][]*proxy.ServicePort)
	if _, err := inc.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	randomPort := func(i int) []*proxy.ServicePort {
		if rng.IntN(5) == 0 {
			return nil // deleted
		}
		var eps []proxy.Endpoint
		for j := range rng.IntN(6) {
			eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", rng.IntN(3), 2+rng.IntN(8)), uint16(8080+j%2), rng.IntN(2) == 0))
		}
		slices.SortFunc(eps, func(a, b proxy.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
		eps = slices.CompactFunc(eps, func(a, b proxy.Endpoint) bool { return a.AddrPort() == b.AddrPort() })
		sp := clusterIPPort(fmt.Sprint("s", i), fmt.Sprintf("10.96.0.%d", i+1), 80, cluster.TCP, eps...)
		for _, e := range eps {
			if e.Local {
				sp.LocalEndpoints = append(sp.LocalEndpoints, e)
			}
		}
		sp.InternalPolicyLocal = rng.IntN(4) == 0
		if rng.IntN(2) == 0 {
			sp.NodePort = uint16(30000 + i)
			sp.ExternalPolicyLocal = rng.IntN(2) == 0
		}
		if rng.IntN(3) == 0 {
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", rng.IntN(4)))} // sometimes shared
		}
		if rng.IntN(3) == 0 {
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("198.51.100.%d", i))}
			if rng.IntN(2) == 0 {
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", rng.IntN(3)))}
			}
		}
		if rng.IntN(3) == 0 {
			sp.AffinityTimeout = time.Duration(1+rng.IntN(100)) * time.Second
		}
		return []*proxy.ServicePort{sp}
	}
	for step := range 300 {
		changed := make(map[cluster.Key]bool)
		for range 1 + rng.IntN(3) {
			i := rng.IntN(12)
			k := key(fmt.Sprint("s", i))
			changed[k] = true
			if p := randomPort(i); p != nil {
				ports[k] = p
			} else {
				delete(ports, k)
			}
		}
		if _, err := inc.Sync(ports, changed, false); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		fm, fs, fb := NewFakeMaps()
		if _, err := NewSyncer(fm, nil).Sync(ports, nil, true); err != nil {
			t.Fatal(err)
		}
		if got, want := view(t, s, b), view(t, fs, fb); !slices.Equal(got, want) && !sharedExternalIP(got, want) {
			t.Fatalf("step %d: incremental\n%s\nfull\n%s", step, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if g := garbage(s, b); len(g) > 0 {
			t.Fatalf("step %d: unreachable entries %v", step, g)
		}
		if got, want := ranges(t, maps, s), ranges(t, fm, fs); !slices.Equal(got, want) {
			t.Fatalf("step %d: source ranges %v, full load %v", step, got, want)
		}
		checkMaglev(t, maps, s, b)
	}
}

// ranges lists the source-range entries as "frontend range", failing on
// one whose service id no frontend checks.
func ranges(t *testing.T, m *Maps, s *FakeTable[svcKey, svcVal]) []string {
	t.Helper()
	bySvc := map[uint32][]string{}
	for k, v := range s.Entries {
		if k.Slot == 0 && v.Flags&feSrcRange != 0 {
			bySvc[v.Id] = append(bySvc[v.Id], addrFrom16(k.Addr).String())
		}
	}
	var out []string
	for k := range m.Ranges.(*FakeTable[rangeKey, uint8]).Entries {
		fes, ok := bySvc[k.Svc]
		if !ok {
			t.Fatalf("source range of service %d, which no frontend with ranges uses", k.Svc)
		}
		p := netip.PrefixFrom(addrFrom16(k.Addr), int(k.Prefixlen)-32-96)
		for _, fe := range fes {
			out = append(out, fe+" "+p.String())
		}
	}
	slices.Sort(out)
	return out
}

// sharedExternalIP accepts a difference only in who holds a frontend two
// Services claim (the first holder keeps it until a full sync).
func sharedExternalIP(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(strings.HasPrefix(a[i], "192.0.2.") && strings.HasPrefix(b[i], "192.0.2.")) {
			return false
		}
	}
	return true
}

// checkMaglev checks that every external frontend with backends has a
// Maglev table naming exactly its service's backends, and that no table
// is left without one.
func checkMaglev(t *testing.T, m *Maps, s *FakeTable[svcKey, svcVal], b *FakeTable[uint32, backend]) {
	t.Helper()
	tables := m.Maglev.(*FakeTable[uint32, maglevTable]).Entries
	used := map[uint32]bool{}
	for k, v := range s.Entries {
		if k.Slot != 0 || k.Scope != scopeExt || v.Count == 0 {
			continue
		}
		used[v.Id] = true
		tab, ok := tables[v.Id]
		if !ok {
			t.Fatalf("external frontend %v (service %d) has no Maglev table", addrFrom16(k.Addr), v.Id)
		}
		ids := map[uint32]bool{}
		for _, id := range tab.Ids {
			if b.Entries[id].Svc != v.Id {
				t.Fatalf("Maglev table of service %d names backend %d of service %d", v.Id, id, b.Entries[id].Svc)
			}
			ids[id] = true
		}
		if len(ids) != int(v.Count) {
			t.Fatalf("Maglev table of service %d names %d backends, the frontend counts %d", v.Id, len(ids), v.Count)
		}
	}
	for id := range tables {
		if !used[id] {
			t.Fatalf("Maglev table of service %d, which no external frontend uses", id)
		}
	}
}

// A periodic full sync puts back what someone changed in the maps behind
// the syncer's back (entries deleted, rewritten, added), and only that;
// the next one writes nothing.
func TestFullSyncRepairsDrift(t *testing.T) {
	maps, s, b := NewFakeMaps()
	sy := NewSyncer(maps, nil)
	np := clusterIPPort("np", "10.96.0.20", 80, cluster.UDP, ep("10.244.1.5", 8080, true), ep("10.244.2.5", 8080, false), ep("10.244.3.5", 8080, false))
	np.NodePort = 30080
	np.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
	np.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("a"):  {clusterIPPort("a", "10.96.0.10", 53, cluster.UDP, ep("10.244.1.2", 5353, true))},
		key("np"): {np},
	}
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	want := view(t, s, b)
	ranges := maps.Ranges.(*FakeTable[rangeKey, uint8])
	tables := maps.Maglev.(*FakeTable[uint32, maglevTable])
	wantRanges, wantTables := len(ranges.Entries), len(tables.Entries)

	garbageIP := addr16(netip.MustParseAddr("10.96.9.9"))
	for _, drift := range []struct {
		what   string
		change func()
	}{
		{"a slot deleted", func() {
			for k := range s.Entries {
				if k.Slot == 2 {
					delete(s.Entries, k)
					return
				}
			}
		}},
		{"a backend rewritten", func() {
			for id, be := range b.Entries {
				be.Port++
				b.Entries[id] = be
				return
			}
		}},
		{"a frontend, slot and UDP backend added", func() {
			s.Entries[svcKey{Addr: garbageIP, Port: be16(80), Proto: 6}] = svcVal{Id: 999, Count: 1}
			s.Entries[svcKey{Addr: garbageIP, Port: be16(80), Proto: 6, Slot: 1}] = svcVal{Id: 998}
			b.Entries[998] = backend{Proto: 17, Port: be16(1), Svc: 999}
		}},
		{"a Maglev table deleted", func() {
			for id := range tables.Entries {
				delete(tables.Entries, id)
				return
			}
		}},
		{"a source range added", func() { ranges.Entries[rangeKey{Prefixlen: 32 + 96 + 8, Svc: 12345}] = 1 }},
	} {
		drift.change()
		if _, err := sy.Sync(ports, nil, true); err != nil {
			t.Fatal(err)
		}
		if got := view(t, s, b); !slices.Equal(got, want) {
			t.Errorf("%s, then a full sync:\n%s\nwant:\n%s", drift.what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if g := garbage(s, b); len(g) > 0 {
			t.Errorf("%s, then a full sync: left behind %v", drift.what, g)
		}
		if len(ranges.Entries) != wantRanges || len(tables.Entries) != wantTables {
			t.Errorf("%s, then a full sync: %d source ranges and %d Maglev tables, want %d and %d", drift.what, len(ranges.Entries), len(tables.Entries), wantRanges, wantTables)
		}
		checkMaglev(t, maps, s, b)
	}
	// The garbage backend removed was UDP: its endpoint is reported.
	if removed := sy.TakeRemovedUDP(); !slices.Contains(removed, netip.AddrPortFrom(netip.Addr{}, 1)) {
		t.Errorf("removed UDP endpoints %v, want the garbage backend's among them", removed)
	}
	s.Log, b.Log = nil, nil
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if len(s.Log)+len(b.Log) != 0 {
		t.Errorf("a full sync after the repair wrote %v %v", s.Log, b.Log)
	}
}

// The two ports of a dual-stack Service share their name. Synced again
// with changes, each keeps ids of its own, as a first full sync gives
// them: the tc programs find a frontend's Maglev table by its service id,
// and a shared one sent IPv6 flows to an IPv4 backend's table (or the
// reverse).
func TestSyncDualStackPortsKeepTheirOwnIDs(t *testing.T) {
	maps, s, b := NewFakeMaps()
	sy := NewSyncer(maps, nil)
	web := func(n int) map[cluster.Key][]*proxy.ServicePort {
		v4 := clusterIPPort("web", "10.96.0.20", 80, cluster.TCP, ep("10.244.1.5", 8080, false), ep(fmt.Sprintf("10.244.2.%d", n), 8080, false))
		v6 := clusterIPPort("web", "fd00:96::20", 80, cluster.TCP, ep("fd00:244:1::5", 8080, false), ep(fmt.Sprintf("fd00:244:2::%d", n), 8080, false))
		v4.NodePort, v6.NodePort = 30080, 30080
		return map[cluster.Key][]*proxy.ServicePort{key("web"): {v4, v6}}
	}
	maglev := maps.Maglev.(*FakeTable[uint32, maglevTable])
	check := func(when string) {
		t.Helper()
		ids := map[uint32]ipfamily.Family{}
		for k, v := range s.Entries {
			if k.Slot != 0 {
				continue
			}
			fam := keyFamily(k)
			if f, ok := ids[v.Id]; ok && f != fam {
				t.Errorf("%s: service id %d is both an %v and an %v frontend's", when, v.Id, f, fam)
			}
			ids[v.Id] = fam
			named := []uint32{}
			for i := uint16(1); i <= v.Count; i++ {
				named = append(named, s.Entries[svcKey{Addr: k.Addr, Port: k.Port, Proto: k.Proto, Scope: k.Scope, Slot: i}].Id)
			}
			if tab, ok := maglev.Entries[v.Id]; ok && k.Scope == scopeExt {
				named = append(named, tab.Ids[:]...)
			}
			for _, id := range named {
				if be, ok := b.Entries[id]; !ok || ipfamily.Of(addrFrom16(be.Addr)) != fam || be.Svc != v.Id {
					t.Errorf("%s: %v frontend %v (id %d) names backend %d %+v", when, fam, addrFrom16(k.Addr), v.Id, id, be)
					break
				}
			}
		}
	}
	if _, err := sy.Sync(web(5), nil, true); err != nil {
		t.Fatal(err)
	}
	check("first full sync")
	if _, err := sy.Sync(web(6), map[cluster.Key]bool{key("web"): true}, false); err != nil {
		t.Fatal(err)
	}
	check("partial sync")
	if _, err := sy.Sync(web(7), nil, true); err != nil {
		t.Fatal(err)
	}
	check("full sync of a change")
}

// The node's InternalIPs come first in the node addresses, in their
// order, and each family's first is its SNAT address; no address is lost
// or repeated.
func TestNodeAddrsPrimaryFirst(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("10.244.4.0"), netip.MustParseAddr("10.244.4.1"), netip.MustParseAddr("192.168.20.11"),
		netip.MustParseAddr("fd00:10:244:4::"), netip.MustParseAddr("fd00:10:b::b")}
	got := primaryFirst(addrs, []netip.Addr{netip.MustParseAddr("192.168.20.11"), netip.MustParseAddr("fd00:10:b::b"), netip.MustParseAddr("192.0.2.1")})
	want := []netip.Addr{addrs[2], addrs[4], addrs[0], addrs[1], addrs[3]}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	snat := snatAddrs(got)
	if addrFrom16(snat[snatIPv4].Addr) != addrs[2] || addrFrom16(snat[snatIPv6].Addr) != addrs[4] {
		t.Errorf("SNAT addresses %v %v, want %v %v", addrFrom16(snat[0].Addr), addrFrom16(snat[1].Addr), addrs[2], addrs[4])
	}
	if got := primaryFirst(addrs, nil); !slices.Equal(got, addrs) {
		t.Errorf("no primary: %v", got)
	}
}
