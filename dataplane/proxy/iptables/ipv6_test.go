package iptables_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/iptables/iptablestest"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
)

// TestIPv6Rules generates ip6tables rules for 200 IPv6 Services (enough
// for a dispatch tree over 128-bit addresses), restores them into the fake
// and traces first packets: each cluster IP reaches its endpoints, a
// NodePort reaches its endpoint from outside, hairpin and host prefixes
// are /128, no IPv4 notation appears, and every chain name fits
// iptables' 28 characters.
func TestIPv6Rules(t *testing.T) {
	cidr6 := netip.MustParsePrefix("fd00:244::/56")
	node6, client6, outside6 := proxytest.A("fd00:10::11"), proxytest.A("fd00:244:0:1::9"), proxytest.A("fd00:20::5")
	local6 := []netip.Addr{node6, proxytest.A("fd00:244:0:1::1"), proxytest.A("::1")}
	vip := func(i int) netip.Addr { return proxytest.A(fmt.Sprintf("fd00:96::%x:%x", i/256, i%256)) }
	var objs []cluster.Object
	for i := range 200 {
		s := proxytest.Svc(fmt.Sprintf("s%d", i), vip(i).String(), []cluster.ServicePort{proxytest.TCP(80, 0)})
		es := proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)},
			proxytest.EP(proxytest.A("fd00:244:0:1::5"), proxytest.NodeName, true), proxytest.EP(proxytest.A("fd00:244:0:2::7"), "node-b", true))
		es.AddressType = "IPv6"
		objs = append(objs, s, es)
	}
	np := proxytest.Svc("np", "fd00:96::1:0", []cluster.ServicePort{proxytest.TCP(80, 30080)}, func(s *cluster.Service) { s.Type = cluster.ServiceTypeNodePort })
	npEPs := proxytest.Slice(np, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("fd00:244:0:2::7"), "node-b", true))
	npEPs.AddressType = "IPv6"
	objs = append(objs, np, npEPs)
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	state := proxy.NewState(ipfamily.IPv6)
	state.Update(st, proxytest.NodeName, nil, true)

	f := iptablestest.New()
	apply(t, f, iptables.Config{Family: ipfamily.IPv6, ClusterCIDR: cidr6}, state.Ports)
	for _, i := range []int{0, 17, 99, 199} {
		tr := f.Trace(iptablestest.Packet{Src: client6, Dst: vip(i), Proto: "tcp", DPort: 80}, local6)
		if !slices.Equal(tr.Endpoints, []string{"[fd00:244:0:1::5]:8080", "[fd00:244:0:2::7]:8080"}) || tr.Verdict != "ACCEPT" {
			t.Errorf("%v: endpoints %v, verdict %s", vip(i), tr.Endpoints, tr.Verdict)
		}
		if tr.Rules > 60 {
			t.Errorf("%v: a first packet meets %d rules", vip(i), tr.Rules)
		}
	}
	tr := f.Trace(iptablestest.Packet{Src: outside6, Dst: node6, Proto: "tcp", DPort: 30080}, local6)
	if !slices.Equal(tr.Endpoints, []string{"[fd00:244:0:2::7]:8080"}) || !tr.Masquerade["[fd00:244:0:2::7]:8080"] {
		t.Errorf("NodePort from outside: %+v", tr)
	}
	rules := iptables.Generate(iptables.Config{Family: ipfamily.IPv6, ClusterCIDR: cidr6}, state.Ports)
	var tree int
	for table, chains := range rules {
		for name, rs := range chains {
			if len(name) > 28 {
				t.Errorf("chain %s: name longer than 28 characters", name)
			}
			if strings.HasPrefix(name, "PODSVC-D-") {
				tree++
			}
			for _, r := range rs {
				if strings.Contains(r, "/32") || strings.Contains(r, "127.0.0.0/8") || strings.Contains(r, "0.0.0.0") {
					t.Errorf("%s/%s: IPv4 notation in %q", table, name, r)
				}
			}
		}
	}
	if tree == 0 {
		t.Error("200 Services made no dispatch tree chains")
	}
	if post := rules["nat"][iptables.ChainPostrouting]; !slices.Contains(post, "-s fd00:244:0:1::5/128 -d fd00:244:0:1::5/128 -j MASQUERADE") {
		t.Errorf("hairpin rules: %q", post)
	}
	if sv := rules["nat"][iptables.ChainServices]; !slices.Contains(sv, "! -d ::1/128 -m addrtype --dst-type LOCAL -j "+iptables.ChainNodePorts) {
		t.Errorf("NodePort jump: %q", sv)
	}
}
