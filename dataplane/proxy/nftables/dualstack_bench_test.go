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

// BenchmarkDualStackSync measures nftables mode's first sync and one
// endpoint change for n dual-stack Services × 10 endpoints per family (one
// Proxier per family in the one inet table, as proxyd runs them) against n
// single-stack ones, in alternating rounds in fresh namespaces, and prints
// medians and their ratios (issue 22's goal: ≤ 2.2×). PODNET_BENCH=1 only,
// as scripts/bench-services.sh sets it.
func BenchmarkDualStackSync(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	proxytest.BenchDualStack(b, "nftables", perFamilyProxiers)
}

// perFamilyProxiers is nftables mode as proxyd runs it for the benchmarks:
// a Proxier per family, both in the one inet table of the lab's node.
func perFamilyProxiers(l *proxytest.NetnsLab, dual bool) proxy.Backend {
	k := nftables.Netlink{NetNS: int(l.Node.Fd())}
	pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: nftables.NewProxier(benchCfg, k)})
	if dual {
		pf.Backends[ipfamily.IPv6] = nftables.NewProxier(nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")}, k)
	}
	return pf
}
