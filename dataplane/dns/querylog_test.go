package dns

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// logLines decodes the JSON lines written to b.
func logLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	b.Reset()
	return out
}

// TestQueryLogByClass: queries are logged only for the classes asked for,
// with CoreDNS's log fields; nothing is logged when logging is off.
func TestQueryLogByClass(t *testing.T) {
	srv, _ := newTestServer(t, testState(), ZoneOptions{Domain: "cluster.local", ShortNames: true})
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	ask := func() {
		query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeA, false) // success
		query(t, srv, "nope.default.svc.cluster.local.", mdns.TypeA, false)       // denial: NXDOMAIN
		query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeMX, true) // denial: NODATA
		query(t, srv, "www.example.test.", mdns.TypeA, false)                     // error: REFUSED, no forwarder
	}
	for _, c := range []struct {
		classes string
		want    []string // name/type/rcode of each line
	}{
		{"", nil},
		{"none", nil},
		{"success", []string{"kubernetes.default.svc.cluster.local. A NOERROR"}},
		{"denial", []string{"nope.default.svc.cluster.local. A NXDOMAIN", "kubernetes.default.svc.cluster.local. MX NOERROR"}},
		{"error", []string{"www.example.test. A REFUSED"}},
		{"success,error", []string{"kubernetes.default.svc.cluster.local. A NOERROR", "www.example.test. A REFUSED"}},
		{"all", []string{"kubernetes.default.svc.cluster.local. A NOERROR", "nope.default.svc.cluster.local. A NXDOMAIN",
			"kubernetes.default.svc.cluster.local. MX NOERROR", "www.example.test. A REFUSED"}},
	} {
		classes, err := ParseLogClasses(c.classes)
		if err != nil {
			t.Fatal(err)
		}
		srv.SetLog(LogOptions{Queries: classes, Logger: log})
		ask()
		var got []string
		for _, l := range logLines(t, &buf) {
			got = append(got, l["name"].(string)+" "+l["type"].(string)+" "+l["rcode"].(string))
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("classes %q: logged\n%s\nwant\n%s", c.classes, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
	srv.SetLog(LogOptions{Queries: LogAll, Logger: log})
	query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeMX, true)
	l := logLines(t, &buf)[0]
	for k, want := range map[string]any{"msg": "query", "level": "INFO", "class": "IN", "proto": "udp", "do": false,
		"bufsize": 4096.0, "flags": "qr,aa,rd", "id": float64(l["id"].(float64))} {
		if l[k] != want {
			t.Errorf("line %v: %s = %v, want %v", l, k, l[k], want)
		}
	}
	for _, k := range []string{"client", "size", "rsize", "duration"} {
		if _, ok := l[k]; !ok {
			t.Errorf("line %v: no %s", l, k)
		}
	}
	if _, err := ParseLogClasses("success,warning"); err == nil || !strings.Contains(err.Error(), `"warning"`) {
		t.Errorf("ParseLogClasses(success,warning): %v, want an error naming warning", err)
	}
}

// TestQueryLogRateLimited: past the rate, lines are left out and the next
// line written says how many.
func TestQueryLogRateLimited(t *testing.T) {
	srv, _ := newTestServer(t, testState(), ZoneOptions{Domain: "cluster.local"})
	var buf bytes.Buffer
	srv.SetLog(LogOptions{Queries: LogAll, Rate: 2, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	now := time.Unix(1_000_000, 0)
	srv.qlog.Load().now = func() time.Time { return now }
	for range 7 {
		query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeA, false)
	}
	if n := len(logLines(t, &buf)); n != 2 {
		t.Fatalf("7 queries at once at 2 lines/s: %d lines, want 2 (the burst)", n)
	}
	now = now.Add(500 * time.Millisecond) // room for one more
	query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeA, false)
	query(t, srv, "kubernetes.default.svc.cluster.local.", mdns.TypeA, false)
	lines := logLines(t, &buf)
	if len(lines) != 1 || lines[0]["suppressed"] != 5.0 {
		t.Errorf("half a second later, two queries: %v, want one line saying 5 suppressed", lines)
	}
}

// TestErrorLog: a query no upstream answered is logged with the
// forwarder's error when error logging is on, and not otherwise.
func TestErrorLog(t *testing.T) {
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{blackhole(t)}, TryTimeout: 100 * time.Millisecond, Deadline: 300 * time.Millisecond}, CacheOptions{})
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	fs.srv.SetLog(LogOptions{Queries: LogSuccess, Logger: log})
	query(t, fs.srv, "a.example.test.", mdns.TypeA, false)
	if lines := logLines(t, &buf); len(lines) != 0 {
		t.Errorf("errors off: %v", lines)
	}
	fs.srv.SetLog(LogOptions{Errors: true, Logger: log})
	if m := query(t, fs.srv, "b.example.test.", mdns.TypeAAAA, false); m.Rcode != mdns.RcodeServerFailure {
		t.Fatalf("answer %v, want SERVFAIL", m)
	}
	lines := logLines(t, &buf)
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["name"] != "b.example.test." || lines[0]["type"] != "AAAA" || lines[0]["err"] == "" {
		t.Errorf("errors on: %v, want one ERROR line for b.example.test. AAAA with the error", lines)
	}
}

// BenchmarkServeLog is BenchmarkServeMetrics/off with query logging off,
// on for every query (a JSON line each, to io.Discard, unlimited), and on
// at the default rate (most lines left out): the thread's CPU per query.
func BenchmarkServeLog(b *testing.B) {
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	q := new(mdns.Msg)
	q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
	pkt, _ := q.Pack()
	discard := slog.New(slog.NewJSONHandler(io.Discard, nil))
	for _, c := range []struct {
		name string
		o    LogOptions
	}{
		{"off", LogOptions{}},
		{"all", LogOptions{Queries: LogAll, Rate: 1e12, Logger: discard}},
		{"all-default-rate", LogOptions{Queries: LogAll, Logger: discard}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := NewServer(ServerOptions{Zone: z, Log: c.o})
			sc := s.pool.Get().(*scratch)
			ctx := context.Background()
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			for b.Loop() {
				if resp, _ := s.serve(ctx, pkt, sc, false, false); resp == nil {
					b.Fatal("no answer")
				}
			}
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
