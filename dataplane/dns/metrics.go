package dns

import (
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are dnsd's Prometheus metrics. The per-query counters are
// resolved once, up front, so counting a query is an array index and an
// atomic add.
type Metrics struct {
	requests        *prometheus.CounterVec
	byType          map[uint16]*rcodeCounters
	other           rcodeCounters
	duration        prometheus.Histogram
	cacheHits       prometheus.Counter
	cacheMisses     prometheus.Counter
	cacheStale      prometheus.Counter
	cachePrefetch   prometheus.Counter
	forwardRequests *prometheus.CounterVec
	forwardRefused  prometheus.Counter
	forged          prometheus.Counter
}

var countedTypes = []uint16{
	mdns.TypeA, mdns.TypeAAAA, mdns.TypeSRV, mdns.TypePTR, mdns.TypeTXT, mdns.TypeCNAME,
	mdns.TypeNS, mdns.TypeSOA, mdns.TypeMX, mdns.TypeHTTPS, mdns.TypeSVCB, mdns.TypeANY,
}

// NewMetrics registers dnsd's metrics with reg. cache and fwd may be nil.
func NewMetrics(reg prometheus.Registerer, zone *Zone, cache *Cache, fwd *Forwarder) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dnsd_requests_total", Help: "DNS requests answered, by query type and response code.",
		}, []string{"type", "rcode"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dnsd_request_duration_seconds", Help: "Time to answer a request (sampled: one request in eight).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}),
		cacheHits:     prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_cache_hits_total", Help: "Forwarded names answered from the cache."}),
		cacheMisses:   prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_cache_misses_total", Help: "Forwarded names not in the cache."}),
		cacheStale:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_cache_served_stale_total", Help: "Expired answers served because no upstream answered."}),
		cachePrefetch: prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_cache_prefetch_total", Help: "Popular entries refreshed before they expired."}),
		forwardRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dnsd_forward_requests_total", Help: "Queries sent to each upstream.",
		}, []string{"upstream"}),
		forwardRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_forward_refused_total", Help: "Queries refused because too many were being forwarded."}),
		forged:         prometheus.NewCounter(prometheus.CounterOpts{Name: "dnsd_forward_forged_answers_total", Help: "Upstream answers dropped because their ID or question did not match."}),
		byType:         map[uint16]*rcodeCounters{},
	}
	for _, t := range countedTypes {
		m.byType[t] = &rcodeCounters{vec: m.requests, qtype: mdns.TypeToString[t]}
	}
	m.other = rcodeCounters{vec: m.requests, qtype: "other"}
	reg.MustRegister(m.requests, m.duration, m.cacheHits, m.cacheMisses, m.cacheStale, m.cachePrefetch,
		m.forwardRequests, m.forwardRefused, m.forged)
	if cache != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dnsd_cache_entries", Help: "Entries in the cache of forwarded answers.",
		}, func() float64 { return float64(cache.Len()) }))
	}
	if fwd != nil {
		fwd.metrics = m
		for _, u := range fwd.Upstreams() {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "dnsd_upstream_healthy", Help: "1 when the upstream is in use, 0 when it is down or loops back to dnsd.",
				ConstLabels: prometheus.Labels{"upstream": u.String()},
			}, func() float64 {
				if fwd.Healthy(u) {
					return 1
				}
				return 0
			}))
		}
	}
	if zone != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dnsd_zone_names", Help: "Names in the cluster zone index.",
		}, func() float64 { return float64(len(zone.snap.Load().names)) }))
	}
	return m
}

func (m *Metrics) observe(qtype uint16, resp []byte, start time.Time) {
	rc := int(resp[3] & 0xF)
	if rc == 0 && binary.BigEndian.Uint16(resp[10:]) > 0 && isBadVers(resp) {
		rc = rcodeBadVers
	}
	set := m.byType[qtype]
	if set == nil {
		set = &m.other
	}
	set.inc(rc)
	if !start.IsZero() {
		m.duration.Observe(time.Since(start).Seconds())
	}
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

// rcodeCounters are one query type's request counters, by rcode, created on
// first use so that /metrics lists only what happened.
type rcodeCounters struct {
	vec   *prometheus.CounterVec
	qtype string
	c     [17]atomic.Pointer[prometheus.Counter]
}

func (r *rcodeCounters) inc(rc int) {
	p := r.c[rc].Load()
	if p == nil {
		name := mdns.RcodeToString[rc]
		if name == "" {
			name = strconv.Itoa(rc)
		}
		c := r.vec.WithLabelValues(r.qtype, name)
		p = &c
		r.c[rc].Store(p)
	}
	(*p).Inc()
}
