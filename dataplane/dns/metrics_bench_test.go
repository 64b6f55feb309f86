package dns

import (
	"context"
	"net"
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

// BenchmarkServeUDPMetrics is BenchmarkServeMetrics through a real UDP
// socket on loopback, with the client in the same process: the process's
// CPU time per query, client and system calls included, without and with
// Metrics. 16 queries are kept in flight; a window whose answers do not
// come within 200 ms is counted as lost and sent again.
func BenchmarkServeUDPMetrics(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		b.Run(name, func(b *testing.B) {
			z := NewZone(testState(), ZoneOptions{ShortNames: true})
			z.Flush()
			var m *Metrics
			if on {
				m = NewMetrics(prometheus.NewRegistry(), z, nil, nil)
			}
			to := runLoopback(b, ServerOptions{Zone: z, Metrics: m, Sockets: 1})
			c, err := net.DialUDP("udp", nil, to)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			q := new(mdns.Msg)
			q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
			pkt, _ := q.Pack()
			buf := make([]byte, 512)
			const window = 16
			lost := 0
			cpu0 := processCPU(b)
			b.ResetTimer()
			for sent, got := 0, 0; got < b.N; {
				for ; sent < b.N && sent-got < window; sent++ {
					c.Write(pkt)
				}
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				if _, err := c.Read(buf); err != nil {
					lost += sent - got
					sent = got
					continue
				}
				got++
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "proc-cpu-ns/op")
			b.ReportMetric(float64(lost), "lost")
		})
	}
}

// processCPU is the CPU time of the whole process.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
