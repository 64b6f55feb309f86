package nftables_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// scalePorts is n ClusterIP Services × eps endpoints (IPv4), built through
// the proxy's own State as proxyd does.
func scalePorts(n, eps int) map[cluster.Key][]*proxy.ServicePort {
	var objs []cluster.Object
	for i := range n {
		s := proxytest.Svc(fmt.Sprintf("s%05d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1),
			[]cluster.ServicePort{proxytest.TCP(80, 0)})
		var e []proxytest.Endpoint
		for j := range eps {
			e = append(e, proxytest.EP(netip.MustParseAddr(fmt.Sprintf("10.%d.%d.%d", 245+j, i/250, i%250+1)), "node-b", true))
		}
		objs = append(objs, s, proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, e...))
	}
	return proxytest.World(objs...)
}

// TestRealKernelResyncAtScale: the maps outgrow one netlink attribute
// (2,000 frontends in the Service map are ~140 KiB of elements, a list's
// length is 16 bits); the first sync, a full resync, and a full sync after
// a restart, which finds the table, each leave the table meant.
func TestRealKernelResyncAtScale(t *testing.T) {
	roottest.Require(t)
	l := proxytest.NewNetnsLab(t, "rsy")
	k := kernelOf(t, l.Node)
	ports := scalePorts(2000, 10)
	want := func() *nftables.Table { return defaultCfg.Generate(ports) }
	p := nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatalf("first full sync: %v", err)
	}
	sameAsKernel(t, k, want())
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatalf("full resync of the same proxier: %v", err)
	}
	sameAsKernel(t, k, want())
	p = nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatalf("full sync after a restart: %v", err)
	}
	sameAsKernel(t, k, want())
}
