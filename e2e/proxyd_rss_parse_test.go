package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/roottest"
)

// BenchmarkStateFileHeap is the other half of what BenchmarkProxydRSS's
// proxyd holds besides its proxy Backend (proxytest.SyncHeap): the Go heap
// of parsing its state directory's one file of 10,000 Services × 10
// endpoints (single-stack, then dual-stack: a second cluster IP and an
// IPv6 slice each) with statedir.ParseFile, sampled every millisecond: the
// file, the largest live heap and heap of objects while parsing, and the
// live heap after (the file and what was parsed). PODNET_BENCH=1 only.
func BenchmarkStateFileHeap(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	lim := convert.Limits{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")},
		NodePorts: convert.PortRange{Min: 30000, Max: 32767}}
	sample := func(name string) uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	fmt.Printf("| stack | file | parse | largest live heap while parsing | largest heap of objects | live after (file and parsed objects) |\n|---|---|---|---|---|---|\n")
	for _, dual := range []bool{false, true} {
		data := []byte(rssServicesYAML(10000, 10, dual))
		runtime.GC()
		var live, objs uint64
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				live, objs = max(live, sample("/gc/heap/live:bytes")), max(objs, sample("/memory/classes/heap/objects:bytes"))
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		start := time.Now()
		parsed, err := statedir.ParseFile("rss-services.yaml", data, lim)
		took := time.Since(start)
		close(stop)
		<-done
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		after := sample("/gc/heap/live:bytes")
		runtime.KeepAlive(parsed)
		runtime.KeepAlive(data)
		fmt.Printf("| %s | %d MiB | %.1f s | %d MiB | %d MiB | %d MiB |\n", map[bool]string{false: "single", true: "dual"}[dual], len(data)>>20, took.Seconds(), live>>20, objs>>20, after>>20)
	}
}
