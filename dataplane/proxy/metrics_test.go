package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/metricstest"
)

// kubeProxyMetrics lists the metrics of kube-proxy in iptables mode
// (pkg/proxy/metrics, v1.33) that proxyd exposes, with their types and
// label names.
var kubeProxyMetrics = []metricstest.Metric{
	{Name: "kubeproxy_sync_proxy_rules_duration_seconds", Type: dto.MetricType_HISTOGRAM},
	{Name: "kubeproxy_sync_full_proxy_rules_duration_seconds", Type: dto.MetricType_HISTOGRAM},
	{Name: "kubeproxy_sync_partial_proxy_rules_duration_seconds", Type: dto.MetricType_HISTOGRAM},
	{Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Type: dto.MetricType_GAUGE},
	{Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", Type: dto.MetricType_GAUGE},
	{Name: "kubeproxy_network_programming_duration_seconds", Type: dto.MetricType_HISTOGRAM},
	{Name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending", Type: dto.MetricType_GAUGE},
	{Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total", Type: dto.MetricType_COUNTER},
	{Name: "kubeproxy_sync_proxy_rules_service_changes_pending", Type: dto.MetricType_GAUGE},
	{Name: "kubeproxy_sync_proxy_rules_service_changes_total", Type: dto.MetricType_COUNTER},
	{Name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", Type: dto.MetricType_COUNTER},
	{Name: "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", Type: dto.MetricType_COUNTER},
	{Name: "kubeproxy_sync_proxy_rules_iptables_total", Type: dto.MetricType_GAUGE, Labels: []string{"table"}},
	{Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total", Type: dto.MetricType_GAUGE, Labels: []string{"traffic_policy"}},
}

func TestMetricsAsKubeProxy(t *testing.T) {
	st := cluster.NewStore()
	objs := svcObjs(0)
	// A Service with externalTrafficPolicy Local whose one endpoint runs
	// on another node.
	objs = append(objs, &cluster.Service{Namespace: "ns", Name: "lb", Type: cluster.ServiceTypeNodePort,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.50")}, ExternalTrafficPolicyLocal: true,
		Ports: []cluster.ServicePort{{Name: "p", Protocol: cluster.TCP, Port: 80, NodePort: 30080}}},
		&cluster.EndpointSlice{Namespace: "ns", Name: "lb-x", ServiceName: "lb", AddressType: "IPv4",
			Ports:     []cluster.EndpointPort{{Name: "p", Protocol: cluster.TCP, Port: 8080}},
			Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.9")}, Ready: true, Serving: true, NodeName: "n2"}}})
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1)}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- Run(ctx, Options{Store: st, NodeName: "n1", Backend: b, SyncPeriod: time.Hour, MinSyncPeriod: 10 * time.Millisecond, Metrics: m})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	b.wait(t, 1)
	// An endpoint change the endpoint slice controller stamped 2 s ago,
	// and a failed partial sync before it is programmed.
	b.mu.Lock()
	b.fail = 1
	b.mu.Unlock()
	es := svcObjs(0)[1].(*cluster.EndpointSlice)
	es.Endpoints[0].Addresses = []netip.Addr{netip.MustParseAddr("10.244.1.99")}
	es.TriggerTime = time.Now().Add(-2 * time.Second)
	m.changes.mu.Lock()
	m.changes.start = es.TriggerTime.Add(-time.Second)
	m.changes.mu.Unlock()
	st.Upsert(es)
	b.wait(t, 3)

	type want struct {
		name   string
		labels []string
		want   float64
	}
	wants := []want{
		{"kubeproxy_sync_proxy_rules_duration_seconds", nil, 2},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", nil, 2},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", nil, 0},
		{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", nil, 1},
		{"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", nil, 1},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, 1}, // changes from before Run are the initial state
		{"kubeproxy_sync_proxy_rules_service_changes_total", nil, 0},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", nil, 0},
		{"kubeproxy_network_programming_duration_seconds", nil, 1},
		{"kubeproxy_sync_proxy_rules_iptables_total", []string{"table", "nat"}, 1},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "external"}, 1},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "internal"}, 0},
		{"podnet_proxy_service_ports", nil, 2},
	}
	// The backend returns before the syncer records the sync, so scrape
	// until the third sync shows (or the deadline passes).
	var got metricstest.Families
	var wrong []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got = metricstest.Scrape(t, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		wrong = wrong[:0]
		for _, c := range wants {
			if v, ok := metricstest.Value(got, c.name, c.labels...); !ok || v != c.want {
				wrong = append(wrong, fmt.Sprintf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want))
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range wrong {
		t.Error(w)
	}
	metricstest.Check(t, got, kubeProxyMetrics, "podnet_proxy_")
	// The programming latency is measured from the trigger time.
	f := got["kubeproxy_network_programming_duration_seconds"].Metric[0].Histogram
	if s := f.GetSampleSum(); s < 2 || s > 60 {
		t.Errorf("network programming latency %v s, want from 2 s (the trigger time's age)", s)
	}
}
