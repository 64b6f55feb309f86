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

// BenchmarkDualStackSync measures iptables mode's (iptables-nft, with
// ip6tables-nft beside it for IPv6, one Proxier per family as proxyd runs
// them) first sync and one endpoint change for n dual-stack Services × 10
// endpoints per family against n single-stack ones, in alternating rounds
// in fresh namespaces, and prints medians and their ratios (issue 22's
// goal: ≤ 2.2×). PODNET_BENCH=1 only, as scripts/bench-services.sh sets it.
func BenchmarkDualStackSync(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	proxytest.BenchDualStack(b, "iptables-nft", perFamilyProxiers)
}

// perFamilyProxiers is iptables mode as proxyd runs it for the benchmarks:
// an iptables-nft Proxier for IPv4 and, dual-stack, an ip6tables-nft one
// beside it.
func perFamilyProxiers(_ *proxytest.NetnsLab, dual bool) proxy.Backend {
	pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: iptables.NewProxier(iptables.Config{Family: ipfamily.IPv4, ClusterCIDR: proxytest.ClusterCIDR},
		iptables.ExecRunner{Backend: iptables.BackendNFT, Family: ipfamily.IPv4})})
	if dual {
		pf.Backends[ipfamily.IPv6] = iptables.NewProxier(iptables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")},
			iptables.ExecRunner{Backend: iptables.BackendNFT, Family: ipfamily.IPv6})
	}
	return pf
}
