package nftables_test

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// BenchmarkSyncHeap shows what bounds proxyd's memory in nftables mode:
// the Go heap of 10,000 Services × 10 endpoints (single- and dual-stack,
// one Proxier per family as proxyd runs them) through three full syncs
// into a namespace's kernel: the state alone, the largest live heap any
// garbage collection during a sync found, the largest heap of objects
// (live and not yet collected) sampled every millisecond, and what is
// left live after the syncs. With GOGC=100 the runtime lets the heap grow
// to twice the live heap before it collects. PODNET_BENCH=1 only (root).
func BenchmarkSyncHeap(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	fmt.Printf("| stack | state | largest live heap during a full sync | largest heap of objects | live after the syncs |\n|---|---|---|---|---|\n")
	for _, dual := range []bool{false, true} {
		_, state := proxytest.DualStackState(10000, 10, dual)
		runtime.GC()
		base := heapSample("/gc/heap/live:bytes")
		l := proxytest.NewNetnsLab(b, fmt.Sprintf("heap%v", dual))
		k := nftables.Netlink{NetNS: int(l.Node.Fd())}
		pf := proxy.NewPerFamily(map[ipfamily.Family]proxy.Backend{ipfamily.IPv4: nftables.NewProxier(benchCfg, k)})
		if dual {
			pf.Backends[ipfamily.IPv6] = nftables.NewProxier(nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")}, k)
		}
		live, objs := heapPeaks(b, func() error {
			for range 3 {
				if _, err := pf.Sync(state.Ports, nil, true); err != nil {
					return err
				}
			}
			return nil
		})
		runtime.GC()
		after := heapSample("/gc/heap/live:bytes")
		runtime.KeepAlive(pf)
		runtime.KeepAlive(state)
		stack := map[bool]string{false: "single", true: "dual"}[dual]
		fmt.Printf("| %s | %d MiB | %d MiB | %d MiB | %d MiB |\n", stack, base>>20, live>>20, objs>>20, after>>20)
		b.ReportMetric(float64(live)/(1<<20), stack+"-peak-live-MiB")
	}
}

// heapPeaks runs f, sampling the live heap of the last collection and the
// heap's objects every millisecond, and returns their largest values.
func heapPeaks(b *testing.B, f func() error) (live, objs uint64) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			live = max(live, heapSample("/gc/heap/live:bytes"))
			objs = max(objs, heapSample("/memory/classes/heap/objects:bytes"))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	err := f()
	close(stop)
	<-done
	if err != nil {
		b.Fatal(err)
	}
	return live, objs
}

func heapSample(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
