package iptables_test

import (
	"os"
	"testing"

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
	proxytest.SyncHeap(b, "iptables", perFamilyProxiers)
}
