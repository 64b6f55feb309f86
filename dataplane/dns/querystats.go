package dns

import (
	"encoding/binary"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// The per-query metrics (CoreDNS's requests, responses, DO requests and the
// duration and size histograms) cost more than answering a cluster name
// when each query updates Prometheus's counters and histograms and reads
// the clock twice: ~14 atomic adds and ~90 ns of clock took a cluster
// answer from 106 to 240 ns of CPU (BenchmarkServeMetrics; 108 ns this
// way; BENCHMARKS.md, "dnsd's metrics on the query path"). So a worker
// counts its queries in plain memory (queryStats), adds them to the shared
// totals once per lap of up to maxLap queries and whenever it is about to
// wait for the next query, and reads the clock once per lap; the totals
// become CoreDNS's series only when scraped (queryCollector).
//
// A query's time runs from when its worker took it up to when the worker
// took up the next one, so it includes sending the answer, as CoreDNS's
// includes writing it. A lap's queries were answered back to back, so each
// took at most the lap's time: while a lap is shorter than the first duration bucket
// (0.25 ms), every query of it falls in that bucket and the histogram is what
// timing each query would give, with the lap's time as their sum. A lap
// over that bound is split evenly among its queries (its queries' own times
// are not known), and the next lap is shortened to one query, timed alone,
// until queries are fast again; a lap aims at a quarter of the bound.

// maxLap bounds how many queries a worker holds before adding them to the
// totals: a scrape during a flood misses at most this many per worker.
const maxLap = 64

// The layout of queryStats.counts and queryCollector.totals.
const (
	numTypes       = len(monitoredTypes) + 1                     // the last one "other"
	numSizes       = len(sizeBuckets) + 1                        // the last one +Inf
	offRequests    = 0                                           // [proto][family][type]
	offResponses   = offRequests + 2*2*numTypes                  // [plugin][rcode]
	offDO          = offResponses + int(numPlugins)*(maxRcode+1) // DNSSEC OK requests
	offSizes       = offDO + 1                                   // [proto][request, response][bucket]
	offSizeSums    = offSizes + 2*2*numSizes                     // [proto][request, response], bytes
	offDurations   = offSizeSums + 2*2                           // [bucket], the last one +Inf
	offDurationSum = offDurations + numTimeBuckets + 1           // nanoseconds
	numCounts      = offDurationSum + 1
)

func requestIndex(proto, family, ti int) int { return offRequests + (proto*2+family)*numTypes + ti }

func responseIndex(p plugin, rc int) int { return offResponses + int(p)*(maxRcode+1) + rc }

// sizeLimits are sizeBuckets as integers (they all are).
var sizeLimits = func() (l [len(sizeBuckets)]int) {
	for i, b := range sizeBuckets {
		l[i] = int(b)
	}
	return l
}()

// sizeIndex is the slot of a request (dir 0) or response (dir 1) of size
// bytes: the first bucket whose bound is not below it.
func sizeIndex(proto, dir, size int) int {
	b := 0
	for b < len(sizeLimits) && size > sizeLimits[b] {
		b++
	}
	return offSizes + (proto*2+dir)*numSizes + b
}

// timeLimits are timeBuckets as durations.
var timeLimits = func() (l [numTimeBuckets]time.Duration) {
	for i, b := range timeBuckets {
		l[i] = time.Duration(b * float64(time.Second))
	}
	return l
}()

// queryStats is one worker's count of its queries since it last added them
// to the totals. Only the worker touches it.
type queryStats struct {
	counts [numCounts]uint64
	// dirty lists the counts that are not zero, so adding one query to
	// the totals touches its few counts, not all of them.
	dirty  [numCounts]uint16
	ndirty int
	// untimed queries were counted since lapStart and wait for lap.
	untimed  int
	lapStart time.Duration
	// lapLen is how many queries the current lap may hold.
	lapLen int
}

// count counts one answered query; its time is counted by the next lap.
func (st *queryStats) count(qtype uint16, q *queryInfo, resp []byte) {
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
	rc := int(resp[3] & 0xF)
	if rc == 0 && binary.BigEndian.Uint16(resp[10:]) > 0 && isBadVers(resp) {
		rc = rcodeBadVers
	}
	st.add(requestIndex(proto, family, ti), 1)
	st.add(responseIndex(q.plugin, rc), 1)
	if q.do {
		st.add(offDO, 1)
	}
	st.add(sizeIndex(proto, 0, q.size), 1)
	st.add(sizeIndex(proto, 1, len(resp)), 1)
	st.add(offSizeSums+2*proto, uint64(q.size))
	st.add(offSizeSums+2*proto+1, uint64(len(resp)))
	st.untimed++
}

func (st *queryStats) add(i int, v uint64) {
	if v == 0 {
		return
	}
	if st.counts[i] == 0 {
		st.dirty[st.ndirty] = uint16(i)
		st.ndirty++
	}
	st.counts[i] += v
}

// lap times the untimed queries, answered one after the other from
// lapStart to now, and starts the next lap at now.
func (st *queryStats) lap(now time.Duration) {
	k := st.untimed
	d := max(now-st.lapStart, 0)
	st.lapStart = now
	if k == 0 {
		return
	}
	each := d / time.Duration(k)
	b := 0
	for b < len(timeLimits) && each > timeLimits[b] {
		b++
	}
	st.add(offDurations+b, uint64(k))
	st.add(offDurationSum, uint64(d))
	st.untimed = 0
	st.lapLen = int(min(timeLimits[0]/4/max(each, 1), maxLap))
}

// wake starts a lap for a worker that had been waiting for a query.
func (m *Metrics) wake(st *queryStats) { st.lapStart = m.now() }

// answered is called by a worker after each query it answered; a lap that
// is long enough ends.
func (m *Metrics) answered(st *queryStats) {
	if st.untimed > 0 && st.untimed >= st.lapLen {
		st.lap(m.now())
		m.queries.add(st)
	}
}

// idle ends the lap of a worker about to wait for the next query.
func (m *Metrics) idle(st *queryStats) {
	if st.untimed > 0 {
		st.lap(m.now())
		m.queries.add(st)
	}
}

// queryCollector holds the totals of every worker's queryStats and reports
// them under CoreDNS's names.
type queryCollector struct {
	mu     sync.Mutex
	totals [numCounts]uint64
}

// add moves st's counts into the totals.
func (qc *queryCollector) add(st *queryStats) {
	qc.mu.Lock()
	for _, i := range st.dirty[:st.ndirty] {
		qc.totals[i] += st.counts[i]
		st.counts[i] = 0
	}
	qc.mu.Unlock()
	st.ndirty = 0
}

var (
	requestsDesc = prometheus.NewDesc("coredns_dns_requests_total", "Counter of DNS requests made per zone, protocol and family.",
		[]string{"server", "zone", "view", "proto", "family", "type"}, nil)
	responsesDesc = prometheus.NewDesc("coredns_dns_responses_total", "Counter of response status codes.",
		[]string{"server", "zone", "view", "rcode", "plugin"}, nil)
	durationDesc = prometheus.NewDesc("coredns_dns_request_duration_seconds", "Histogram of the time (in seconds) each request took per zone.",
		[]string{"server", "zone", "view"}, nil)
	requestSizeDesc = prometheus.NewDesc("coredns_dns_request_size_bytes", "Histogram of the size of each request in bytes, per zone and protocol.",
		[]string{"server", "zone", "view", "proto"}, nil)
	responseSizeDesc = prometheus.NewDesc("coredns_dns_response_size_bytes", "Histogram of the size of each response in bytes, per zone and protocol.",
		[]string{"server", "zone", "view", "proto"}, nil)
	doRequestsDesc = prometheus.NewDesc("coredns_dns_do_requests_total", "Counter of requests with the DNSSEC OK (DO) bit set, per zone.",
		[]string{"server", "zone", "view"}, nil)
)

func (qc *queryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{requestsDesc, responsesDesc, durationDesc, requestSizeDesc, responseSizeDesc, doRequestsDesc} {
		ch <- d
	}
}

// Collect reports the series that have counted something, as CoreDNS's
// vectors do: a label set appears with its first query.
func (qc *queryCollector) Collect(ch chan<- prometheus.Metric) {
	qc.mu.Lock()
	t := qc.totals
	qc.mu.Unlock()
	for proto := range 2 {
		for family := range 2 {
			for ti := range numTypes {
				if v := t[requestIndex(proto, family, ti)]; v > 0 {
					typ := "other"
					if ti < len(monitoredTypes) {
						typ = mdns.TypeToString[monitoredTypes[ti]]
					}
					ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(v),
						serverLabel, zoneRoot, noView, protoNames[proto], [2]string{"1", "2"}[family], typ)
				}
			}
		}
	}
	for p := range numPlugins {
		for rc := range maxRcode + 1 {
			if v := t[responseIndex(p, rc)]; v > 0 {
				ch <- prometheus.MustNewConstMetric(responsesDesc, prometheus.CounterValue, float64(v),
					serverLabel, zoneRoot, noView, rcodeName(rc), pluginNames[p])
			}
		}
	}
	if v := t[offDO]; v > 0 {
		ch <- prometheus.MustNewConstMetric(doRequestsDesc, prometheus.CounterValue, float64(v), serverLabel, zoneRoot, noView)
	}
	if h, ok := histogram(durationDesc, t[offDurations:offDurationSum], timeBuckets,
		float64(t[offDurationSum])/float64(time.Second), serverLabel, zoneRoot, noView); ok {
		ch <- h
	}
	for proto := range 2 {
		for dir, desc := range []*prometheus.Desc{requestSizeDesc, responseSizeDesc} {
			at := offSizes + (proto*2+dir)*numSizes
			if h, ok := histogram(desc, t[at:at+numSizes], sizeBuckets[:], float64(t[offSizeSums+proto*2+dir]),
				serverLabel, zoneRoot, noView, protoNames[proto]); ok {
				ch <- h
			}
		}
	}
}

// histogram makes a histogram of counts per bucket (the last one +Inf)
// with the given bounds, if it counted anything.
func histogram(desc *prometheus.Desc, counts []uint64, bounds []float64, sum float64, labels ...string) (prometheus.Metric, bool) {
	var total uint64
	cumulative := make(map[float64]uint64, len(bounds))
	for i, b := range bounds {
		total += counts[i]
		cumulative[b] = total
	}
	total += counts[len(bounds)]
	if total == 0 {
		return nil, false
	}
	return prometheus.MustNewConstHistogram(desc, total, sum, cumulative, labels...), true
}
