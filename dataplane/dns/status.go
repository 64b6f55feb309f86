package dns

import (
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/dataplane/cluster/statedir"
)

// Status is what dnsd reports of itself for `dnsd status`.
type Status struct {
	// Synced: the zone holds a complete cluster state.
	Synced bool `json:"synced"`
	// Stale says why the cluster state may be out of date (the API server
	// is away; the last state is answered from).
	Stale string `json:"stale,omitempty"`
	// StateDir is the state directory's last full scan (nil for the API
	// server).
	StateDir  *statedir.Status `json:"stateDir,omitempty"`
	Zones     []ZoneStatus     `json:"zones"`
	Upstreams []UpstreamStatus `json:"upstreams"`
	// Stubs are the stub domains, most specific first, and their upstreams.
	Stubs []StubStatus `json:"stubDomains,omitempty"`
	Cache *CacheStatus `json:"cache,omitempty"`
}

// StubStatus is one stub domain and the health of its upstreams.
type StubStatus struct {
	Domain    string           `json:"domain"`
	Upstreams []UpstreamStatus `json:"upstreams"`
}

// ZoneStatus is one zone dnsd is authoritative for, and its record count.
type ZoneStatus struct {
	Name string `json:"name"`
	// Names in the cluster zone; PTR records in the reverse zones.
	Records int `json:"records"`
}

// UpstreamStatus is one upstream resolver.
type UpstreamStatus struct {
	Address string `json:"address"`
	Healthy bool   `json:"healthy"`
	Looping bool   `json:"looping,omitempty"`
}

// CacheStatus are the cache's figures since dnsd started.
type CacheStatus struct {
	Success     int     `json:"success"`
	Denial      int     `json:"denial"`
	Hits        float64 `json:"hits"`
	Misses      float64 `json:"misses"`
	ServedStale float64 `json:"servedStale"`
	Prefetches  float64 `json:"prefetches"`
}

// Report describes the zone, the upstreams and the cache; fwd, cache and
// m may be nil.
func Report(z *Zone, fwd *Forwarder, cache *Cache, m *Metrics) Status {
	snap := z.snap.Load()
	st := Status{Synced: snap.synced}
	domain := strings.Trim(z.opts.Domain, ".") + "."
	// The names held as such, as podnet_dns_zone_names counts them;
	// endpoint names (encoded when asked) are not among them.
	st.Zones = append(st.Zones, ZoneStatus{Name: domain, Records: len(snap.names)})
	var v4, v6 int
	count := func(a netip.Addr) {
		if a.Is4() {
			v4++
		} else {
			v6++
		}
	}
	for a := range snap.ptr {
		count(a)
	}
	for a := range snap.ptrMulti {
		count(a)
	}
	st.Zones = append(st.Zones, ZoneStatus{Name: "in-addr.arpa.", Records: v4}, ZoneStatus{Name: "ip6.arpa.", Records: v6})
	if fwd != nil {
		st.Upstreams = upstreamStatus(fwd)
		for _, s := range fwd.stubs {
			st.Stubs = append(st.Stubs, StubStatus{Domain: presentName(s.domain), Upstreams: upstreamStatus(s.fwd)})
		}
	}
	if cache != nil {
		cs := &CacheStatus{}
		cs.Success, cs.Denial = cache.Counts()
		if m != nil {
			cs.Hits = value(m.cacheHits.WithLabelValues(serverLabel, "success", zoneRoot, noView)) +
				value(m.cacheHits.WithLabelValues(serverLabel, "denial", zoneRoot, noView))
			cs.Misses = value(m.cacheMisses.WithLabelValues(serverLabel, zoneRoot, noView))
			cs.ServedStale = value(m.cacheStale.WithLabelValues(serverLabel, zoneRoot, noView))
			cs.Prefetches = value(m.cachePrefetch.WithLabelValues(serverLabel, zoneRoot, noView))
		}
		st.Cache = cs
	}
	return st
}

// upstreamStatus is the health of f's own upstreams (not its stubs').
func upstreamStatus(f *Forwarder) []UpstreamStatus {
	out := make([]UpstreamStatus, 0, len(f.ups))
	for _, u := range f.ups {
		out = append(out, UpstreamStatus{Address: u.addr.String(), Healthy: !u.down.Load() && !u.loop.Load(), Looping: u.loop.Load()})
	}
	return out
}

func value(c prometheus.Counter) float64 {
	var d dto.Metric
	if c.Write(&d) != nil || d.Counter == nil {
		return 0
	}
	return d.Counter.GetValue()
}
