package dns

import (
	"encoding/binary"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/version"
)

// Metrics are dnsd's Prometheus metrics. Where CoreDNS has a metric for the
// same thing it has CoreDNS's name, type, labels and buckets (the metrics,
// cache, forward, proxy and kubernetes plugins), as a Corefile of one server
// block ".:53" with those plugins would show them, so dashboards and alerts
// written for CoreDNS work unchanged; podnet's extras are named podnet_dns_*.
//
// The per-query counters and histograms are resolved once, on first use, so
// counting a query is an array index and an atomic add or an observation.
type Metrics struct {
	requests     *prometheus.CounterVec
	responses    *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	requestSize  *prometheus.HistogramVec
	responseSize *prometheus.HistogramVec
	doRequests   *prometheus.CounterVec
	// byQuery[proto][family][type index] and byResponse[plugin][rcode].
	byQuery    [2][2][len(monitoredTypes) + 1]atomic.Pointer[prometheus.Counter]
	byResponse [numPlugins][maxRcode + 1]atomic.Pointer[prometheus.Counter]
	latency    atomic.Pointer[prometheus.Observer]
	// sizes[proto][0: request, 1: response].
	sizes     [2][2]atomic.Pointer[prometheus.Observer]
	doCounter atomic.Pointer[prometheus.Counter]
	// epoch is what query times are read against (now): time.Since of a
	// time with a monotonic reading reads one clock, time.Now two.
	epoch time.Time

	cacheRequests *prometheus.CounterVec
	cacheHits     *prometheus.CounterVec
	cacheMisses   *prometheus.CounterVec
	cacheStale    *prometheus.CounterVec
	cachePrefetch *prometheus.CounterVec

	proxyDuration     *prometheus.HistogramVec
	healthcheckFails  *prometheus.CounterVec
	healthcheckBroken prometheus.Counter
	forwardRefused    prometheus.Counter
	programming       *prometheus.HistogramVec
	panics            prometheus.Counter
	forged            prometheus.Counter
	tcpRefused        prometheus.Counter
	forwardRequests   *prometheus.CounterVec
	// fwd is the forwarder in use (it changes when the config file does).
	fwd                atomic.Pointer[Forwarder]
	cacheHitsSuccess   atomic.Pointer[prometheus.Counter]
	cacheHitsDenial    atomic.Pointer[prometheus.Counter]
	cacheRequestsTotal atomic.Pointer[prometheus.Counter]
}

// monitoredTypes are the query types CoreDNS's metrics name; every other
// type is counted as "other".
var monitoredTypes = [...]uint16{
	mdns.TypeAAAA, mdns.TypeA, mdns.TypeCNAME, mdns.TypeDNSKEY, mdns.TypeDS, mdns.TypeMX,
	mdns.TypeNSEC3, mdns.TypeNSEC, mdns.TypeNS, mdns.TypePTR, mdns.TypeRRSIG, mdns.TypeSOA,
	mdns.TypeSRV, mdns.TypeTXT, mdns.TypeHTTPS, mdns.TypeSVCB, mdns.TypeIXFR, mdns.TypeAXFR, mdns.TypeANY,
}

// typeIndex maps a query type to its slot in byQuery plus one (0: "other",
// the last slot); every monitored type is below 256, and an array index
// costs less than a map lookup on the query path.
var typeIndex = func() (idx [256]uint8) {
	for i, t := range monitoredTypes {
		idx[t] = uint8(i + 1)
	}
	return idx
}()

// plugin names which part of dnsd wrote a response, as CoreDNS's plugin
// label does.
type plugin uint8

const (
	pluginNone plugin = iota // errors the server answers itself
	pluginKubernetes
	pluginCache
	pluginForward
	pluginHosts
	numPlugins
)

var pluginNames = [numPlugins]string{"", "kubernetes", "cache", "forward", "hosts"}

const maxRcode = 23 // the highest rcode CoreDNS's label names (BADCOOKIE)

// The labels of a Corefile of one server block ".:53": the server is named
// by that block's listen address whatever dnsd listens on, the zone is "."
// and there is no view.
const (
	serverLabel = "dns://:53"
	zoneRoot    = "."
	noView      = ""
)

// timeBuckets are CoreDNS's plugin.TimeBuckets: 0.25 ms to 8 s.
var timeBuckets = prometheus.ExponentialBuckets(0.00025, 2, 16)

// sizeBuckets are CoreDNS's for request and response sizes, in bytes.
var sizeBuckets = []float64{0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16e3, 32e3, 48e3, 64e3}

var protoNames = [2]string{"udp", "tcp"}

// NewMetrics registers dnsd's metrics with reg. zone, cache and fwd may be
// nil. It is one declaration per metric, in CoreDNS's order, with nothing
// to follow from one to the next; split, it would only be harder to check
// against CoreDNS's list.
//
//funclen:ignore
func NewMetrics(reg prometheus.Registerer, zone *Zone, cache *Cache, fwd *Forwarder) *Metrics {
	cacheLabels := []string{"server", "zones", "view"}
	cacheTypeLabels := []string{"server", "type", "zones", "view"}
	m := &Metrics{
		epoch: time.Now(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_dns_requests_total", Help: "Counter of DNS requests made per zone, protocol and family.",
		}, []string{"server", "zone", "view", "proto", "family", "type"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_dns_responses_total", Help: "Counter of response status codes.",
		}, []string{"server", "zone", "view", "rcode", "plugin"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coredns_dns_request_duration_seconds",
			Help:    "Histogram of the time (in seconds) each request took per zone.",
			Buckets: timeBuckets,
		}, []string{"server", "zone", "view"}),
		requestSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coredns_dns_request_size_bytes",
			Help:    "Histogram of the size of each request in bytes, per zone and protocol.",
			Buckets: sizeBuckets,
		}, []string{"server", "zone", "view", "proto"}),
		doRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_dns_do_requests_total", Help: "Counter of requests with the DNSSEC OK (DO) bit set, per zone.",
		}, []string{"server", "zone", "view"}),
		responseSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coredns_dns_response_size_bytes",
			Help:    "Histogram of the size of each response in bytes, per zone and protocol.",
			Buckets: sizeBuckets,
		}, []string{"server", "zone", "view", "proto"}),
		cacheRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_cache_requests_total", Help: "The count of cache requests.",
		}, cacheLabels),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_cache_hits_total", Help: "The count of cache hits.",
		}, cacheTypeLabels),
		cacheMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_cache_misses_total", Help: "The count of cache misses.",
		}, cacheLabels),
		cacheStale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_cache_served_stale_total", Help: "The number of requests served from stale cache entries.",
		}, cacheLabels),
		cachePrefetch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_cache_prefetch_total", Help: "The number of times the cache has prefetched a cached item.",
		}, cacheLabels),
		proxyDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "coredns_proxy_request_duration_seconds", Help: "Histogram of the time each request took.",
			Buckets: timeBuckets,
		}, []string{"proxy_name", "to", "rcode"}),
		healthcheckFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coredns_proxy_healthcheck_failures_total", Help: "Counter of the number of failed healthchecks.",
		}, []string{"proxy_name", "to"}),
		healthcheckBroken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coredns_forward_healthcheck_broken_total", Help: "Counter of the number of complete failures of the healthchecks.",
		}),
		forwardRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coredns_forward_max_concurrent_rejects_total", Help: "Counter of the number of queries rejected because the concurrent queries were at maximum.",
		}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "coredns_kubernetes_dns_programming_duration_seconds", Help: "Histogram of the time (in seconds) it took to program a dns instance.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"service_kind"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coredns_panics_total", Help: "A metrics that counts the number of panics.",
		}),
		forwardRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podnet_dns_forward_requests_total", Help: "Queries sent to each upstream, answered or not.",
		}, []string{"upstream"}),
		forged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_dns_forward_forged_answers_total", Help: "Upstream answers dropped because their ID or question did not match.",
		}),
		tcpRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_dns_tcp_connections_refused_total", Help: "TCP connections closed at once because the cap on concurrent ones was reached.",
		}),
	}
	// The cache's series exist from the start, at zero, as alerts on
	// their rates expect.
	if cache != nil {
		for _, vec := range []*prometheus.CounterVec{m.cacheRequests, m.cacheMisses, m.cacheStale, m.cachePrefetch} {
			vec.WithLabelValues(serverLabel, zoneRoot, noView)
		}
		m.cacheHits.WithLabelValues(serverLabel, "success", zoneRoot, noView)
		m.cacheHits.WithLabelValues(serverLabel, "denial", zoneRoot, noView)
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "coredns_build_info", Help: "A metric with a constant '1' value labeled by version, revision, and goversion from which CoreDNS was built.",
	}, []string{"version", "revision", "goversion"})
	buildInfo.WithLabelValues(version.Version, version.Revision(), runtime.Version()).Set(1)
	reg.MustRegister(m.requests, m.responses, m.duration, m.requestSize, m.doRequests, m.responseSize, m.cacheRequests, m.cacheHits, m.cacheMisses,
		m.cacheStale, m.cachePrefetch, m.proxyDuration, m.healthcheckFails, m.healthcheckBroken,
		m.forwardRefused, m.programming, m.panics, m.forged, m.forwardRequests, m.tcpRefused, buildInfo)
	if cache != nil {
		for _, kind := range []struct {
			name   string
			denial bool
		}{{"success", false}, {"denial", true}} {
			labels := prometheus.Labels{"server": serverLabel, "type": kind.name, "zones": zoneRoot, "view": noView}
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "coredns_cache_entries", Help: "The number of elements in the cache.", ConstLabels: labels,
			}, func() float64 {
				success, denial := cache.Counts()
				if kind.denial {
					return float64(denial)
				}
				return float64(success)
			}), prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "coredns_cache_evictions_total", Help: "The count of cache entries dropped to make room for new ones.", ConstLabels: labels,
			}, func() float64 {
				success, denial := cache.Evictions()
				if kind.denial {
					return float64(denial)
				}
				return float64(success)
			}))
		}
	}
	if fwd != nil {
		m.Use(fwd)
		reg.MustRegister(upstreamHealth{m})
	}
	if zone != nil {
		zone.metrics.Store(m)
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "podnet_dns_zone_names", Help: "Names in the cluster zone index.",
		}, func() float64 { return float64(len(zone.snap.Load().names)) }))
	}
	return m
}

// Use makes f, and its stub domains' forwarders, record into m, and the
// one whose upstreams podnet_dns_upstream_healthy reports.
func (m *Metrics) Use(f *Forwarder) {
	f.metrics = m
	for _, s := range f.stubs {
		s.fwd.metrics = m
	}
	m.fwd.Store(f)
}

var upstreamHealthDesc = prometheus.NewDesc("podnet_dns_upstream_healthy",
	"1 when the upstream is in use, 0 when it is down or loops back to dnsd.", []string{"upstream", "domain"}, nil)

// upstreamHealth reports the upstreams of the forwarder in use, and of its
// stub domains.
type upstreamHealth struct{ m *Metrics }

func (upstreamHealth) Describe(ch chan<- *prometheus.Desc) { ch <- upstreamHealthDesc }

func (u upstreamHealth) Collect(ch chan<- prometheus.Metric) {
	f := u.m.fwd.Load()
	if f == nil {
		return
	}
	emit := func(f *Forwarder, domain string) {
		for _, a := range f.Upstreams() {
			v := 0.0
			if f.Healthy(a) {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(upstreamHealthDesc, prometheus.GaugeValue, v, a.String(), domain)
		}
	}
	emit(f, ".")
	for _, s := range f.stubs {
		emit(s.fwd, presentName(s.domain))
	}
}

// counter returns the counter cached in p, creating it from vec with
// values on first use.
func counter(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, values ...string) prometheus.Counter {
	c := p.Load()
	if c == nil {
		cc := vec.WithLabelValues(values...)
		c = &cc
		p.Store(c)
	}
	return *c
}

// queryInfo describes how a query came in, for the request labels.
type queryInfo struct {
	tcp, v6 bool
	do      bool // the DNSSEC OK bit
	plugin  plugin
	size    int // of the request, in bytes
}

// now is the time to pass to observe as the query's start.
func (m *Metrics) now() time.Duration { return time.Since(m.epoch) }

// observe counts one answered query that started at start (now).
func (m *Metrics) observe(qtype uint16, q queryInfo, resp []byte, start time.Duration) {
	ti := len(monitoredTypes)
	if qtype < 256 && typeIndex[qtype] != 0 {
		ti = int(typeIndex[qtype]) - 1
	}
	proto, family := 0, 0
	if q.tcp {
		proto = 1
	}
	if q.v6 {
		family = 1
	}
	p := &m.byQuery[proto][family][ti]
	if p.Load() == nil {
		typ := "other"
		if ti < len(monitoredTypes) {
			typ = mdns.TypeToString[qtype]
		}
		counter(p, m.requests, serverLabel, zoneRoot, noView, protoNames[proto], [2]string{"1", "2"}[family], typ)
	}
	(*p.Load()).Inc()
	if q.do {
		counter(&m.doCounter, m.doRequests, serverLabel, zoneRoot, noView).Inc()
	}

	rc := int(resp[3] & 0xF)
	if rc == 0 && binary.BigEndian.Uint16(resp[10:]) > 0 && isBadVers(resp) {
		rc = rcodeBadVers
	}
	counter(&m.byResponse[q.plugin][rc], m.responses, serverLabel, zoneRoot, noView, rcodeName(rc), pluginNames[q.plugin]).Inc()
	observer(&m.latency, m.duration, serverLabel, zoneRoot, noView).Observe((m.now() - start).Seconds())
	observer(&m.sizes[proto][0], m.requestSize, serverLabel, zoneRoot, noView, protoNames[proto]).Observe(float64(q.size))
	observer(&m.sizes[proto][1], m.responseSize, serverLabel, zoneRoot, noView, protoNames[proto]).Observe(float64(len(resp)))
}

// observer returns the observer cached in p, creating it from vec with
// values on first use.
func observer(p *atomic.Pointer[prometheus.Observer], vec *prometheus.HistogramVec, values ...string) prometheus.Observer {
	o := p.Load()
	if o == nil {
		obs := vec.WithLabelValues(values...)
		o = &obs
		p.Store(o)
	}
	return *o
}

// rcodeName is the rcode's name as CoreDNS's label spells it.
func rcodeName(rc int) string {
	if rc == rcodeBadVers {
		return "BADVERS"
	}
	if name := mdns.RcodeToString[rc]; name != "" {
		return name
	}
	return strconv.Itoa(rc)
}

// cacheHit counts a fresh answer from the cache.
func (m *Metrics) cacheHit(denial bool) {
	p, typ := &m.cacheHitsSuccess, "success"
	if denial {
		p, typ = &m.cacheHitsDenial, "denial"
	}
	counter(p, m.cacheHits, serverLabel, typ, zoneRoot, noView).Inc()
	m.cacheRequest()
}

// cacheMiss counts a name the cache did not hold fresh.
func (m *Metrics) cacheMiss() {
	m.cacheMisses.WithLabelValues(serverLabel, zoneRoot, noView).Inc()
	m.cacheRequest()
}

func (m *Metrics) cacheRequest() {
	counter(&m.cacheRequestsTotal, m.cacheRequests, serverLabel, zoneRoot, noView).Inc()
}

func (m *Metrics) servedStale() {
	m.cacheStale.WithLabelValues(serverLabel, zoneRoot, noView).Inc()
}

func (m *Metrics) prefetched() {
	m.cachePrefetch.WithLabelValues(serverLabel, zoneRoot, noView).Inc()
}

// upstreamAnswered records one exchange with an upstream.
func (m *Metrics) upstreamAnswered(to string, rcode int, took time.Duration) {
	m.proxyDuration.WithLabelValues("forward", to, rcodeName(rcode)).Observe(took.Seconds())
}

func (m *Metrics) healthcheckFailed(to string) {
	m.healthcheckFails.WithLabelValues("forward", to).Inc()
}

// programmed records how long after its trigger time a change to a
// Service of the given kind became answerable.
func (m *Metrics) programmed(headless bool, took time.Duration) {
	kind := "cluster_ip"
	if headless {
		kind = "headless_with_selector"
	}
	m.programming.WithLabelValues(kind).Observe(took.Seconds())
}

// isBadVers reports whether the response's OPT record carries BADVERS.
func isBadVers(resp []byte) bool {
	// Our OPT record is always last and 11 bytes long.
	if len(resp) < headerLen+11 {
		return false
	}
	opt := resp[len(resp)-11:]
	return opt[0] == 0 && binary.BigEndian.Uint16(opt[1:]) == typeOPT && opt[5] == 1
}
