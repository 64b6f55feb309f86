package ebpf

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Describe reads back what a sync wrote, resolved slot by slot, and names
// what a program would trip over once the maps are tampered with.
func TestDescribe(t *testing.T) {
	maps, s, b := NewFakeMaps()
	node := netip.MustParseAddr("192.168.10.11")
	sy := NewSyncer(maps, func() ([]netip.Addr, error) { return []netip.Addr{node}, nil })
	np := clusterIPPort("np", "10.96.0.20", 80, cluster.TCP, ep("10.244.1.5", 8080, true), ep("10.244.2.5", 8080, false))
	np.NodePort = 30080
	np.ExternalPolicyLocal = true
	np.LocalEndpoints = np.ClusterEndpoints[:1]
	np.AffinityTimeout = 3 * time.Hour
	lb := clusterIPPort("lb", "10.96.0.21", 443, cluster.TCP, ep("10.244.2.6", 8443, false))
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.60")}
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("dns"):   {clusterIPPort("dns", "10.96.0.10", 53, cluster.UDP, ep("10.244.1.2", 5353, true), ep("10.244.1.3", 5353, true))},
		key("empty"): {clusterIPPort("empty", "10.96.0.11", 80, cluster.TCP)},
		key("np"):    {np},
		key("lb"):    {lb},
	}
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := maps.SNAT.Put([]uint32{0}, []bpf.NodeportSnatAddr{{Addr: addr16(node)}}); err != nil {
		t.Fatal(err)
	}
	p, err := Describe(maps)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range p.Frontends {
		got = append(got, fmt.Sprintf("%s/%s %s %v aff=%d maglev=%d ranges=%v -> %s", f.Address, f.Protocol, f.Scope,
			f.Flags, f.AffinitySeconds, f.Maglev, f.SourceRanges, strings.Join(f.Backends, ",")))
	}
	want := []string{
		"10.96.0.10:53/UDP socket [] aff=0 maglev=0 ranges=[] -> 10.244.1.2:5353,10.244.1.3:5353",
		"10.96.0.11:80/TCP socket [reject] aff=0 maglev=0 ranges=[] -> ",
		"10.96.0.20:80/TCP socket [affinity] aff=10800 maglev=0 ranges=[] -> 10.244.1.5:8080,10.244.2.5:8080",
		"10.96.0.21:443/TCP socket [] aff=0 maglev=0 ranges=[] -> 10.244.2.6:8443",
		"192.0.2.60:443/TCP external [source-ranges] aff=0 maglev=1 ranges=[203.0.113.0/24] -> 10.244.2.6:8443",
		":30080/TCP external [affinity local] aff=10800 maglev=1 ranges=[] -> 10.244.1.5:8080",
		":30080/TCP socket [affinity] aff=10800 maglev=0 ranges=[] -> 10.244.1.5:8080,10.244.2.5:8080",
	}
	if !slices.Equal(got, want) {
		t.Errorf("frontends:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(p.Problems) > 0 || p.Backends != len(b.Entries) || !slices.Equal(p.NodeAddrs, []string{"192.168.10.11"}) || !slices.Equal(p.SNAT, []string{"192.168.10.11"}) {
		t.Errorf("problems %v, backends %d (map %d), node addresses %v, SNAT %q", p.Problems, p.Backends, len(b.Entries), p.NodeAddrs, p.SNAT)
	}

	// Tampered: a counted slot gone (its backend left unreached), a
	// backend two frontends name gone.
	vip := svcKey{Addr: addr16(netip.MustParseAddr("10.96.0.10")), Port: be16(53), Proto: 17, Slot: 2}
	orphan := s.Entries[vip].Id // named by no other slot once vip goes
	gone := s.Entries[svcKey{Addr: addr16(netip.MustParseAddr("10.96.0.21")), Port: be16(443), Proto: 6, Slot: 1}].Id
	if err := s.Delete([]svcKey{vip}); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete([]uint32{gone}); err != nil {
		t.Fatal(err)
	}
	p, err = Describe(maps)
	if err != nil {
		t.Fatal(err)
	}
	wantProblems := []string{
		fmt.Sprintf("backend %d: no slot names it", orphan),
		"frontend 10.96.0.10:53/UDP (socket): slot 2 of 2 missing",
		fmt.Sprintf("frontend 10.96.0.21:443/TCP (socket): slot 1 names backend %d, which is missing", gone),
		fmt.Sprintf("frontend 192.0.2.60:443/TCP (external): slot 1 names backend %d, which is missing", gone),
	}
	if !slices.Equal(p.Problems, wantProblems) {
		t.Errorf("problems after tampering:\n%s\nwant:\n%s", strings.Join(p.Problems, "\n"), strings.Join(wantProblems, "\n"))
	}
}
