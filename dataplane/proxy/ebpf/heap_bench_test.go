package ebpf

import (
	"os"
	"testing"

	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// BenchmarkSyncHeap: what bounds proxyd's memory in ebpf mode (one Syncer
// for both families' ports, into freshly loaded maps; see
// proxytest.SyncHeap). PODNET_BENCH=1 only (root).
func BenchmarkSyncHeap(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	proxytest.SyncHeap(b, "ebpf", func(_ *proxytest.NetnsLab, _ bool) proxy.Backend {
		dp, err := load("")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dp.Close() })
		return NewSyncer(dp.Maps, nil)
	})
}
