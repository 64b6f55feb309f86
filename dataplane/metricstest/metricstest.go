// Package metricstest scrapes a Prometheus /metrics endpoint the way a
// Prometheus server does and checks the result against a reference list of
// metric names, types and label names (kube-proxy's, CoreDNS's), so a
// dashboard written for the reference finds the same series.
package metricstest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric is one entry of a reference list.
type Metric struct {
	Name   string
	Type   dto.MetricType
	Labels []string // label names, any order
}

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs /metrics from h in the text format and parses it.
func Scrape(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return Parse(t, rec.Body.String())
}

// Parse parses the text exposition format.
func Parse(t testing.TB, text string) Families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// Check reports every reference metric that is missing, of another type or
// with other label names, and every scraped metric that is neither in the
// reference nor named with one of ownPrefixes.
func Check(t testing.TB, got Families, reference []Metric, ownPrefixes ...string) {
	t.Helper()
	known := map[string]bool{}
	for _, want := range reference {
		known[want.Name] = true
		f, ok := got[want.Name]
		if !ok {
			t.Errorf("metric %s missing", want.Name)
			continue
		}
		if f.GetType() != want.Type {
			t.Errorf("metric %s: type %v, want %v", want.Name, f.GetType(), want.Type)
		}
		wantLabels := slices.Sorted(slices.Values(want.Labels))
		if len(f.Metric) == 0 {
			t.Errorf("metric %s: no samples, so its labels cannot be checked", want.Name)
		}
		for _, m := range f.Metric {
			var names []string
			for _, l := range m.Label {
				names = append(names, l.GetName())
			}
			slices.Sort(names)
			if !slices.Equal(names, wantLabels) {
				t.Errorf("metric %s: labels %v, want %v", want.Name, names, wantLabels)
				break
			}
		}
	}
	for name := range got {
		if known[name] || hasPrefix(name, ownPrefixes) {
			continue
		}
		t.Errorf("metric %s is neither in the reference list nor named %v", name, ownPrefixes)
	}
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Value returns the value of the sample of name whose labels include
// every pair of labels ("name", "value", ...), and whether there is one.
// Counters and gauges give their value, histograms their count.
func Value(got Families, name string, labels ...string) (float64, bool) {
	f, ok := got[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.Metric {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	if len(pairs)%2 != 0 {
		panic(fmt.Sprintf("metricstest: odd label list %v", pairs))
	}
	for i := 0; i < len(pairs); i += 2 {
		found := false
		for _, l := range m.Label {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
