package nftables_test

import (
	"net/netip"
	"os"
	"testing"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// BenchmarkSyncHeap: what bounds proxyd's memory in nftables mode (one
// Proxier per family in the one inet table, as proxyd runs them; see
// proxytest.SyncHeap). PODNET_BENCH=1 only (root).
func BenchmarkSyncHeap(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	proxytest.SyncHeap(b, "nftables", func(l *proxytest.NetnsLab, dual bool) proxy.Backend {
		k := nftables.Netlink{NetNS: int(l.Node.Fd())}
		pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: nftables.NewProxier(benchCfg, k)})
		if dual {
			pf.Backends[ipfamily.IPv6] = nftables.NewProxier(nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")}, k)
		}
		return pf
	})
}
