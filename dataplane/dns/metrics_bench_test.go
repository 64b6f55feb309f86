package dns

import (
	"context"
	"runtime"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// BenchmarkServeMetrics is the cost of CoreDNS-style counting on the query
// path: the same cluster A query without and with Metrics, side by side,
// answered as a busy UDP worker answers it (serveUDP without the socket):
// every query is counted in the requests, responses and both size
// histograms and timed into the duration histogram, the clock read once per
// lap of queries.
func BenchmarkServeMetrics(b *testing.B) {
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	q := new(mdns.Msg)
	q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
	pkt, _ := q.Pack()
	for _, c := range []struct {
		name string
		m    *Metrics
	}{
		{"off", nil},
		{"on", NewMetrics(prometheus.NewRegistry(), z, nil, nil)},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := NewServer(ServerOptions{Zone: z, Metrics: c.m})
			sc := s.pool.Get().(*scratch)
			ctx := context.Background()
			b.ReportAllocs()
			// On a shared machine the wall time per query follows the
			// load; the thread's CPU time does not count the time it was
			// not running.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			if c.m != nil {
				c.m.wake(&sc.stats)
			}
			for b.Loop() {
				if resp, _ := s.serve(ctx, pkt, sc, false, false); resp == nil {
					b.Fatal("no answer")
				}
				if c.m != nil {
					c.m.answered(&sc.stats)
				}
			}
			if c.m != nil {
				c.m.idle(&sc.stats)
			}
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// threadCPU is the CPU time of the calling thread.
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}
