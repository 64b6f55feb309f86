package ebpf

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// TestSocketLBIPv6: socket LB of IPv6 Services, through connect6,
// sendmsg6, recvmsg6 and getpeername6 with native IPv6 addresses, beside
// IPv4 Services in the same maps (a dual-stack node's one set): the same
// semantics the IPv4 cases of TestSocketLB check.
func TestSocketLBIPv6(t *testing.T) {
	e := newSockEnv(t)
	dp, err := Open(e.pinDir, e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	node4, node6 := netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("fd00:77::1")
	sy := NewSyncer(dp.Maps, func() ([]netip.Addr, error) { return []netip.Addr{node4, node6}, nil })
	b1, b2 := "[fd00:244:1::2]:8080", "[fd00:244:1::3]:8080"
	both := []proxy.Endpoint{ep("fd00:244:1::2", 8080, true), ep("fd00:244:1::3", 8080, false)}
	web := clusterIPPort("web", "fd00:96::10", 80, cluster.TCP, both...)
	web.NodePort = 30080
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("fd00:192::50")}
	web4 := clusterIPPort("web", "10.96.0.10", 80, cluster.TCP, ep("10.244.1.2", 8080, true))
	web4.NodePort = 30080
	dns := clusterIPPort("dns", "fd00:96::11", 53, cluster.UDP, both[:1]...)
	sticky := clusterIPPort("sticky", "fd00:96::12", 80, cluster.TCP, both...)
	sticky.AffinityTimeout = time.Hour
	itp := clusterIPPort("itp", "fd00:96::14", 80, cluster.TCP, both...)
	itp.InternalPolicyLocal = true
	itp.LocalEndpoints = both[1:]
	itpNone := clusterIPPort("itpnone", "fd00:96::15", 80, cluster.TCP, both...)
	itpNone.InternalPolicyLocal = true
	udp := clusterIPPort("udp2", "fd00:96::16", 53, cluster.UDP, both[:1]...)
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("web"): {web4, web}, key("dns"): {dns}, key("sticky"): {sticky}, key("itp"): {itp}, key("itpnone"): {itpNone},
		key("empty"): {clusterIPPort("empty", "fd00:96::13", 80, cluster.TCP)}, key("udp2"): {udp},
		key("emptyudp"): {clusterIPPort("emptyudp", "fd00:96::17", 53, cluster.UDP)},
	}
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}

	t.Run("ClusterIP, external IP and NodePort spread over both backends; getpeername says the VIP", func(t *testing.T) {
		for _, addr := range []string{"[fd00:96::10]:80", "[fd00:192::50]:80", "[fd00:77::1]:30080"} {
			lines := e.client(true, "tcp "+addr+" 40")
			seen := backendsSeen(lines)
			if seen[b1] < 5 || seen[b2] < 5 || len(seen) != 2 {
				t.Errorf("%s: %v", addr, seen)
			}
			for _, l := range lines {
				if !strings.HasSuffix(l, " "+addr) {
					t.Errorf("%s: %q: peer is not the Service address", addr, l)
					break
				}
			}
		}
	})
	t.Run("the IPv4 ClusterIP and NodePort of the same dual-stack Service answer from the IPv4 endpoint", func(t *testing.T) {
		for _, addr := range []string{"10.96.0.10:80", "192.168.77.1:30080"} {
			if seen := backendsSeen(e.client(true, "tcp "+addr+" 5")); seen["10.244.1.2:8080"] != 5 {
				t.Errorf("%s: %v, want 10.244.1.2:8080 only", addr, seen)
			}
		}
	})
	t.Run("a process outside the cgroup is not translated", func(t *testing.T) {
		if got := e.client(false, "tcp [fd00:96::10]:80 1"); strings.HasPrefix(got[0], "ok") {
			t.Errorf("outside the cgroup: %v", got)
		}
	})
	t.Run("no endpoints: ECONNREFUSED; internalTrafficPolicy Local: the local endpoint, none local: unreachable", func(t *testing.T) {
		for _, l := range e.client(true, "tcp [fd00:96::13]:80 3", "udp [fd00:96::17]:53 1", "cudp [fd00:96::17]:53 1") {
			if l != "err ECONNREFUSED" {
				t.Errorf("no endpoints: %q, want ECONNREFUSED", l)
			}
		}
		if got := e.client(true, "tcp [fd00:96::15]:80 1"); got[0] != "err EHOSTUNREACH" {
			t.Errorf("internalTrafficPolicy Local without local endpoints: %v", got)
		}
		if seen := backendsSeen(e.client(true, "tcp [fd00:96::14]:80 10")); seen[b2] != 10 {
			t.Errorf("internalTrafficPolicy Local: %v, want only the local endpoint", seen)
		}
	})
	t.Run("UDP unconnected and connected: replies come from the VIP", func(t *testing.T) {
		for _, l := range e.client(true, "udp [fd00:96::11]:53 3", "cudp [fd00:96::11]:53 3") {
			f := strings.Fields(l)
			if len(f) != 4 || f[0] != "ok" || f[1] != b1 || f[3] != "[fd00:96::11]:53" {
				t.Errorf("UDP: %q; want an answer from %s seen as from [fd00:96::11]:53", l, b1)
			}
		}
	})
	t.Run("session affinity keeps one backend", func(t *testing.T) {
		if seen := backendsSeen(e.client(true, "tcp [fd00:96::12]:80 20")); len(seen) != 1 {
			t.Errorf("affinity: %v", seen)
		}
	})
	t.Run("proxyd status reads the IPv6 frontends back from the pinned maps", func(t *testing.T) {
		p, err := ReadPinned(e.pinDir)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Problems) > 0 {
			t.Errorf("problems: %v", p.Problems)
		}
		i := slices.IndexFunc(p.Frontends, func(f ProgrammedFrontend) bool {
			return f.Address == "[fd00:96::10]:80" && f.Scope == "socket"
		})
		if i < 0 {
			t.Fatalf("no frontend [fd00:96::10]:80 in %+v", p.Frontends)
		}
		if got := p.Frontends[i].Backends; !slices.Equal(got, []string{b1, b2}) {
			t.Errorf("[fd00:96::10]:80 backends %v, want [%s %s]", got, b1, b2)
		}
		var nodePorts []string
		for _, f := range p.Frontends {
			if f.Address == ":30080" && f.Scope == "socket" {
				nodePorts = append(nodePorts, f.Family+" "+strings.Join(f.Backends, ","))
			}
		}
		slices.Sort(nodePorts)
		if want := []string{"IPv4 10.244.1.2:8080", "IPv6 " + b1 + "," + b2}; !slices.Equal(nodePorts, want) {
			t.Errorf("NodePort frontends %q, want one per family %q", nodePorts, want)
		}
		if !slices.Contains(p.NodeAddrs, "fd00:77::1") {
			t.Errorf("node addresses %v lack fd00:77::1", p.NodeAddrs)
		}
	})
	t.Run("an endpoint change: the next connection and datagram go to the new endpoint, a connected UDP socket on the removed one is destroyed", func(t *testing.T) {
		sy.TakeRemovedUDP()
		sy.TakeMovedUDP()
		h := e.hold(t, "hold", "[fd00:96::16]:53", b1)
		web2, dns2, udp2 := *web, *dns, *udp
		web2.ClusterEndpoints, dns2.ClusterEndpoints, udp2.ClusterEndpoints = both[1:], both[1:], both[1:]
		ports[key("web")] = []*proxy.ServicePort{web4, &web2}
		ports[key("dns")] = []*proxy.ServicePort{&dns2}
		ports[key("udp2")] = []*proxy.ServicePort{&udp2}
		if _, err := sy.Sync(ports, map[cluster.Key]bool{key("web"): true, key("dns"): true, key("udp2"): true}, false); err != nil {
			t.Fatal(err)
		}
		if seen := backendsSeen(e.client(true, "tcp [fd00:96::10]:80 10", "udp [fd00:96::11]:53 5")); seen[b2] != 15 {
			t.Errorf("after the change: %v", seen)
		}
		removed := sy.TakeRemovedUDP()
		if want := netip.MustParseAddrPort(b1); !slices.Equal(removed, []netip.AddrPort{want}) {
			t.Fatalf("removed UDP endpoints %v, want [%v]", removed, want)
		}
		if n, err := dp.Terminate([]FlowTarget{{Backend: removed[0]}}, e.cgroup); err != nil || n == 0 {
			t.Fatalf("terminate: %d namespaces, %v", n, err)
		}
		h.checkDestroyed(t, b2)
	})
}
