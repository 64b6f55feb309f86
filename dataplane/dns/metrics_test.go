package dns

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/metricstest"
)

// corednsMetrics lists the metrics of CoreDNS (v1.12 and its main branch of
// August 2026: plugin/metrics/vars,
// plugin/cache, plugin/forward, plugin/pkg/proxy, plugin/kubernetes/object,
// plugin/metrics) that dnsd exposes, with their types and label names.
var corednsMetrics = []metricstest.Metric{
	{Name: "coredns_dns_requests_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zone", "view", "proto", "family", "type"}},
	{Name: "coredns_dns_responses_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zone", "view", "rcode", "plugin"}},
	{Name: "coredns_dns_request_duration_seconds", Type: dto.MetricType_HISTOGRAM, Labels: []string{"server", "zone", "view"}},
	{Name: "coredns_dns_request_size_bytes", Type: dto.MetricType_HISTOGRAM, Labels: []string{"server", "zone", "view", "proto"}},
	{Name: "coredns_dns_response_size_bytes", Type: dto.MetricType_HISTOGRAM, Labels: []string{"server", "zone", "view", "proto"}},
	{Name: "coredns_dns_do_requests_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zone", "view"}},
	{Name: "coredns_cache_entries", Type: dto.MetricType_GAUGE, Labels: []string{"server", "type", "zones", "view"}},
	{Name: "coredns_cache_requests_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zones", "view"}},
	{Name: "coredns_cache_hits_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "type", "zones", "view"}},
	{Name: "coredns_cache_misses_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zones", "view"}},
	{Name: "coredns_cache_served_stale_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zones", "view"}},
	{Name: "coredns_cache_prefetch_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "zones", "view"}},
	{Name: "coredns_cache_evictions_total", Type: dto.MetricType_COUNTER, Labels: []string{"server", "type", "zones", "view"}},
	{Name: "coredns_proxy_request_duration_seconds", Type: dto.MetricType_HISTOGRAM, Labels: []string{"proxy_name", "to", "rcode"}},
	{Name: "coredns_proxy_healthcheck_failures_total", Type: dto.MetricType_COUNTER, Labels: []string{"proxy_name", "to"}},
	{Name: "coredns_forward_healthcheck_broken_total", Type: dto.MetricType_COUNTER},
	{Name: "coredns_forward_max_concurrent_rejects_total", Type: dto.MetricType_COUNTER},
	{Name: "coredns_autopath_success_total", Type: dto.MetricType_COUNTER, Labels: []string{"server"}},
	{Name: "coredns_kubernetes_dns_programming_duration_seconds", Type: dto.MetricType_HISTOGRAM, Labels: []string{"service_kind"}},
	{Name: "coredns_panics_total", Type: dto.MetricType_COUNTER},
	{Name: "coredns_build_info", Type: dto.MetricType_GAUGE, Labels: []string{"version", "revision", "goversion"}},
}

func TestMetricsAsCoreDNS(t *testing.T) {
	good := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		if r.Question[0].Name == "gone.test." {
			m := new(mdns.Msg)
			m.SetRcode(r, mdns.RcodeNameError)
			m.Ns = []mdns.RR{mustRR("test. 60 IN SOA ns.test. h.test. 1 60 60 60 60")}
			w.WriteMsg(m)
			return
		}
		answerA(w, r, 300, "192.0.2.1")
	})
	dead := blackhole(t)
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{dead, good.addr}, Policy: PolicySequential,
		TryTimeout: 50 * time.Millisecond, HealthInterval: 20 * time.Millisecond,
	}, CacheOptions{})

	// An EndpointSlice change with a trigger time, programmed by a flush.
	fs.st.Upsert(&cluster.EndpointSlice{Namespace: "testns", Name: "svc1-abc", ServiceName: "svc1", AddressType: "IPv4",
		Ports:       []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}},
		Endpoints:   []cluster.Endpoint{{Addresses: addrs("10.244.1.6"), Ready: true}},
		TriggerTime: time.Now()})
	fs.zone.Flush()

	var reqBytes, respBytes float64
	for _, q := range []struct {
		name  string
		qtype uint16
		rcode int
	}{
		{"svc1.testns.svc.cluster.local.", mdns.TypeA, mdns.RcodeSuccess},
		{"nope.testns.svc.cluster.local.", mdns.TypeA, mdns.RcodeNameError},
		{"svc1.testns.svc.cluster.local.", mdns.TypeCAA, mdns.RcodeSuccess},
		{"www.example.test.", mdns.TypeA, mdns.RcodeSuccess}, // dead upstream fails, then forwarded
		{"www.example.test.", mdns.TypeA, mdns.RcodeSuccess}, // cache
		{"gone.test.", mdns.TypeA, mdns.RcodeNameError},      // dead upstream fails again: down
		{"gone.test.", mdns.TypeA, mdns.RcodeNameError},      // negative cache
	} {
		m, reqLen, respLen := exchange(t, fs.srv, new(mdns.Msg).SetQuestion(q.name, q.qtype))
		if m.Rcode != q.rcode {
			t.Fatalf("%s %s: rcode %s, want %s", q.name, mdns.TypeToString[q.qtype], mdns.RcodeToString[m.Rcode], mdns.RcodeToString[q.rcode])
		}
		reqBytes += float64(reqLen)
		respBytes += float64(respLen)
	}
	// The DNSSEC OK bit is counted.
	_, reqLen, respLen := exchange(t, fs.srv, new(mdns.Msg).SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA).SetEdns0(1232, true))
	reqBytes += float64(reqLen)
	respBytes += float64(respLen)
	h := promhttp.HandlerFor(fs.reg, promhttp.HandlerOpts{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The down upstream's health checks fail in the background.
		if _, ok := metricstest.Value(metricstest.Scrape(t, h), "coredns_proxy_healthcheck_failures_total"); ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := metricstest.Scrape(t, h)
	metricstest.Check(t, got, corednsMetrics, "podnet_dns_")

	server := []string{"server", "dns://:53", "zone", "."}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"coredns_dns_requests_total", append([]string{"proto", "udp", "family", "1", "type", "A"}, server...), 7},
		{"coredns_dns_do_requests_total", server, 1},
		// Every query, not a sample: the histograms count all eight.
		{"coredns_dns_request_duration_seconds", server, 8},
		{"coredns_dns_request_size_bytes", append([]string{"proto", "udp"}, server...), 8},
		{"coredns_dns_response_size_bytes", append([]string{"proto", "udp"}, server...), 8},
		{"coredns_cache_evictions_total", []string{"type", "success"}, 0},
		{"coredns_cache_evictions_total", []string{"type", "denial"}, 0},
		{"coredns_dns_requests_total", []string{"type", "other"}, 1},
		{"coredns_dns_responses_total", append([]string{"rcode", "NOERROR", "plugin", "kubernetes"}, server...), 3},
		{"coredns_dns_responses_total", []string{"rcode", "NXDOMAIN", "plugin", "kubernetes"}, 1},
		{"coredns_dns_responses_total", []string{"rcode", "NOERROR", "plugin", "forward"}, 1},
		{"coredns_dns_responses_total", []string{"rcode", "NOERROR", "plugin", "cache"}, 1},
		{"coredns_dns_responses_total", []string{"rcode", "NXDOMAIN", "plugin", "cache"}, 1},
		{"coredns_cache_hits_total", []string{"type", "success"}, 1},
		{"coredns_cache_hits_total", []string{"type", "denial"}, 1},
		{"coredns_cache_misses_total", nil, 2},
		{"coredns_cache_requests_total", nil, 4},
		{"coredns_cache_entries", []string{"type", "success"}, 1},
		{"coredns_cache_entries", []string{"type", "denial"}, 1},
		{"coredns_proxy_request_duration_seconds", []string{"proxy_name", "forward", "to", good.addr.String(), "rcode", "NOERROR"}, 1},
		{"coredns_proxy_request_duration_seconds", []string{"to", good.addr.String(), "rcode", "NXDOMAIN"}, 1},
		{"coredns_kubernetes_dns_programming_duration_seconds", []string{"service_kind", "cluster_ip"}, 1},
		{"coredns_build_info", nil, 1},
		{"podnet_dns_forward_requests_total", []string{"upstream", dead.String()}, 2},
	} {
		v, ok := metricstest.Value(got, c.name, c.labels...)
		if !ok || v != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	for _, h := range []struct {
		name string
		want float64
	}{{"coredns_dns_request_size_bytes", reqBytes}, {"coredns_dns_response_size_bytes", respBytes}} {
		if sum := histogramSum(got, h.name); sum != h.want {
			t.Errorf("%s_sum = %v, want %v (the sizes of the queries sent and answers received)", h.name, sum, h.want)
		}
	}
	if v, _ := metricstest.Value(got, "coredns_proxy_healthcheck_failures_total", "to", dead.String()); v < 1 {
		t.Errorf("health check failures of the dead upstream: %v, want at least 1", v)
	}
	if v, ok := metricstest.Value(got, "coredns_proxy_request_duration_seconds", "to", dead.String()); ok {
		t.Errorf("unanswered tries of the dead upstream recorded as %v answers", v)
	}
}

// exchange sends q to s over UDP and returns the answer and the sizes of
// both on the wire.
func exchange(t *testing.T, s *Server, q *mdns.Msg) (answer *mdns.Msg, reqLen, respLen int) {
	t.Helper()
	pkt, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	resp := s.Handle(context.Background(), pkt, false)
	answer = new(mdns.Msg)
	if err := answer.Unpack(resp); err != nil {
		t.Fatalf("%v: answer %x: %v", q.Question, resp, err)
	}
	return answer, len(pkt), len(resp)
}

// histogramSum is the _sum of the one histogram named name.
func histogramSum(got metricstest.Families, name string) float64 {
	f, ok := got[name]
	if !ok || len(f.Metric) != 1 || f.Metric[0].Histogram == nil {
		return -1
	}
	return f.Metric[0].Histogram.GetSampleSum()
}

// A lap's queries, answered back to back, each took at most the lap's
// time: under the first duration bucket they all fall in it, exactly as
// timing each would put them. Over it the lap's time is split evenly and the
// next lap is a single query, timed alone.
func TestQueryLaps(t *testing.T) {
	var st queryStats
	st.lapStart = time.Second
	st.untimed = 200
	st.lap(time.Second + 100*time.Microsecond)
	if st.counts[offDurations] != 200 || st.counts[offDurationSum] != uint64(100*time.Microsecond) || st.untimed != 0 {
		t.Errorf("200 queries in 100µs: first bucket %d, sum %v", st.counts[offDurations], time.Duration(st.counts[offDurationSum]))
	}
	if st.lapLen != maxLap || st.lapStart != time.Second+100*time.Microsecond {
		t.Errorf("after 0.5µs a query: laps of %d from %v, want %d from the lap's end", st.lapLen, st.lapStart, maxLap)
	}
	// One slow query alone: its own bucket (0.75 ms is over 0.5, under 1).
	st = queryStats{untimed: 1}
	st.lap(750 * time.Microsecond)
	if st.counts[offDurations+2] != 1 || st.lapLen > 1 {
		t.Errorf("one query of 0.75ms: buckets %v, next lap %d", st.counts[offDurations:offDurationSum], st.lapLen)
	}
	// Eight queries in 4 ms: 0.5 ms each as far as anyone knows.
	st = queryStats{untimed: 8}
	st.lap(4 * time.Millisecond)
	if st.counts[offDurations+1] != 8 || st.counts[offDurationSum] != uint64(4*time.Millisecond) || st.lapLen > 1 {
		t.Errorf("eight queries in 4ms: buckets %v, sum %d, next lap %d", st.counts[offDurations:offDurationSum], st.counts[offDurationSum], st.lapLen)
	}
	// Over 8 s: the +Inf bucket.
	st = queryStats{untimed: 1}
	st.lap(9 * time.Second)
	if st.counts[offDurationSum-1] != 1 {
		t.Errorf("one query of 9s: buckets %v", st.counts[offDurations:offDurationSum])
	}
}

// A UDP worker adds its queries to /metrics once it has nothing left to
// answer: a burst of queries is all counted, in every per-query series,
// without another query to push it out.
func TestUDPWorkerCountsEveryQuery(t *testing.T) {
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	reg := prometheus.NewRegistry()
	to := runLoopback(t, ServerOptions{Zone: z, Metrics: NewMetrics(reg, z, nil, nil), Sockets: 2})
	const clients, each = 4, 50
	var wg sync.WaitGroup
	for range clients {
		c, err := net.DialUDP("udp", nil, to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		q := new(mdns.Msg)
		q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
		pkt, _ := q.Pack()
		wg.Go(func() {
			// The whole burst first, then the answers.
			for range each {
				c.Write(pkt)
			}
			buf := make([]byte, 512)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for range each {
				if _, err := c.Read(buf); err != nil {
					t.Errorf("answer: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	want := float64(clients * each)
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := metricstest.Scrape(t, h)
		req, _ := metricstest.Value(got, "coredns_dns_requests_total", "proto", "udp", "type", "A")
		resp, _ := metricstest.Value(got, "coredns_dns_responses_total", "rcode", "NOERROR", "plugin", "kubernetes")
		dur, _ := metricstest.Value(got, "coredns_dns_request_duration_seconds")
		size, _ := metricstest.Value(got, "coredns_dns_response_size_bytes", "proto", "udp")
		if req == want && resp == want && dur == want && size == want {
			if sum := histogramSum(got, "coredns_dns_request_duration_seconds"); sum <= 0 || sum > 5 {
				t.Errorf("duration sum %vs for %v queries answered within 5s", sum, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the burst: requests %v, responses %v, durations %v, response sizes %v; want %v each", req, resp, dur, size, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runLoopback runs a Server with opts on a free port of 127.0.0.1 until the
// test ends and returns its UDP address.
func runLoopback(tb testing.TB, opts ServerOptions) *net.UDPAddr {
	tb.Helper()
	opts.Listen = []string{"127.0.0.1:0"}
	srv := NewServer(opts)
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	ready := make(chan Listening, 1)
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Run(ctx, ready) }()
	select {
	case l := <-ready:
		return net.UDPAddrFromAddrPort(l.UDP[0])
	case err := <-stopped:
		tb.Fatal(err)
		return nil
	}
}
