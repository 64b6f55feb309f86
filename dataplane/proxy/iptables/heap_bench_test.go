package iptables_test

import (
	"net/netip"
	"os"
	"testing"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// BenchmarkSyncHeap: what bounds proxyd's memory in iptables mode
// (iptables-nft, ip6tables-nft beside it, one Proxier per family as proxyd
// runs them; see proxytest.SyncHeap). The restore children's memory is
// theirs, not counted. PODNET_BENCH=1 only (root).
func BenchmarkSyncHeap(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	proxytest.SyncHeap(b, "iptables", func(_ *proxytest.NetnsLab, dual bool) proxy.Backend {
		pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: iptables.NewProxier(iptables.Config{Family: ipfamily.IPv4, ClusterCIDR: proxytest.ClusterCIDR},
			iptables.ExecRunner{Backend: iptables.BackendNFT, Family: ipfamily.IPv4})})
		if dual {
			pf.Backends[ipfamily.IPv6] = iptables.NewProxier(iptables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")},
				iptables.ExecRunner{Backend: iptables.BackendNFT, Family: ipfamily.IPv6})
		}
		return pf
	})
}
