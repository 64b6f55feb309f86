package dns

import (
	"encoding/binary"
	"net/netip"
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
// The per-query figures are counted by each worker in plain memory and
// added to the shared totals a batch at a time (queryStats); the totals are
// turned into CoreDNS's series when scraped (queryCollector).
type Metrics struct {
	queries queryCollector
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
	autopathSuccess   prometheus.Counter
	forwardRequests   *prometheus.CounterVec
	// fwd is the forwarder in use (it changes when the config file does).
	fwd                atomic.Pointer[Forwarder]
	cacheHitsSuccess   atomic.Pointer[prometheus.Counter]
	cacheHitsDenial    atomic.Pointer[prometheus.Counter]
	cacheRequestsTotal atomic.Pointer[prometheus.Counter]
	cacheMissesTotal   atomic.Pointer[prometheus.Counter]
	cacheStaleTotal    atomic.Pointer[prometheus.Counter]
	cachePrefetchTotal atomic.Pointer[prometheus.Counter]
}

// monitoredTypes are the query types CoreDNS's metrics name; every other
// type is counted as "other".
var monitoredTypes = [...]uint16{
	mdns.TypeAAAA, mdns.TypeA, mdns.TypeCNAME, mdns.TypeDNSKEY, mdns.TypeDS, mdns.TypeMX,
	mdns.TypeNSEC3, mdns.TypeNSEC, mdns.TypeNS, mdns.TypePTR, mdns.TypeRRSIG, mdns.TypeSOA,
	mdns.TypeSRV, mdns.TypeTXT, mdns.TypeHTTPS, mdns.TypeSVCB, mdns.TypeIXFR, mdns.TypeAXFR, mdns.TypeANY,
}

// typeIndex maps a query type to its slot in the requests plus one (0: "other",
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
var timeBuckets = prometheus.ExponentialBuckets(0.00025, 2, numTimeBuckets)

const numTimeBuckets = 16

// sizeBuckets are CoreDNS's for request and response sizes, in bytes.
var sizeBuckets = [...]float64{0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16e3, 32e3, 48e3, 64e3}

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
		autopathSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coredns_autopath_success_total", Help: "Counter of requests that did autopath.",
			ConstLabels: prometheus.Labels{"server": serverLabel},
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
	reg.MustRegister(&m.queries, m.cacheRequests, m.cacheHits, m.cacheMisses,
		m.cacheStale, m.cachePrefetch, m.proxyDuration, m.healthcheckFails, m.healthcheckBroken,
		m.forwardRefused, m.programming, m.panics, m.forged, m.forwardRequests, m.tcpRefused, m.autopathSuccess, buildInfo)
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
	from    netip.AddrPort
	start   time.Time // set only while queries are logged
	// inner: a query dnsd asks itself as part of a client's (autopath's
	// steps); it is neither counted nor logged.
	inner bool
}

// now is the time to pass to lap as the start of a query or of a lap.
func (m *Metrics) now() time.Duration { return time.Since(m.epoch) }

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
	counter(&m.cacheMissesTotal, m.cacheMisses, serverLabel, zoneRoot, noView).Inc()
	m.cacheRequest()
}

func (m *Metrics) cacheRequest() {
	counter(&m.cacheRequestsTotal, m.cacheRequests, serverLabel, zoneRoot, noView).Inc()
}

func (m *Metrics) servedStale() {
	counter(&m.cacheStaleTotal, m.cacheStale, serverLabel, zoneRoot, noView).Inc()
}

func (m *Metrics) prefetched() {
	counter(&m.cachePrefetchTotal, m.cachePrefetch, serverLabel, zoneRoot, noView).Inc()
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
