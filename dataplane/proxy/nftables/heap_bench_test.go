package nftables_test

import (
	"os"
	"testing"

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
	proxytest.SyncHeap(b, "nftables", perFamilyProxiers)
}
