package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Samples in the form each benchmark prints (the figures are BENCHMARKS.md's).
const cniOut = `
| operation | podnet median | podnet p99 | bridge+host-local median | bridge+host-local p99 |
|---|---|---|---|---|
| ADD sequential | 27.1 ms | 435.5 ms | 35.7 ms | 715.3 ms |
| DEL sequential | 41.8 ms | 433.9 ms | 49.4 ms | 739.1 ms |
| ADD 20 at a time | 269.1 ms | 811.8 ms | 446.2 ms | 1532.4 ms |
| DEL 20 at a time | 228.9 ms | 475.8 ms | 227.1 ms | 545.2 ms |

podnet ADD steps inside the plugin (ipam includes waiting for the store lock):

| mode | step | median | p99 |
|---|---|---|---|
| sequential | ipam | 6.45 ms | 417.98 ms |
`

const routingOut = `goos: linux
BenchmarkPodThroughput-2   	       1	30000000000 ns/op	        13.59 bare-Gbit/s	        10.48 hostgw-Gbit/s	         0.7712 hostgw/bare
rounds (Gbit/s): bare 13.59 11.63 14.02; host-gw 9.74 10.48 11.02; vxlan 7.64 8.47 8.58
median: bare veth 13.59 Gbit/s; host-gw 10.48 Gbit/s (0.77 of bare); vxlan 8.47 Gbit/s (0.62 of bare)
best:   bare veth 14.02 Gbit/s; host-gw 11.02 Gbit/s (0.79 of bare); vxlan 8.58 Gbit/s (0.61 of bare)
`

const servicesOut = `# 2026-11-27T17:01:02Z 6.18.0, 2 cores, load: 1.0 1.1 1.2
| backend | Services × endpoints | full sync (iptables CPU) | one endpoint changed (iptables CPU) | nat rules | nat chains | proxy RSS | iptables-restore RSS |
|---|---|---|---|---|---|---|---|
| nft | 1000 × 10 | 0.34 s (0.29 s) | 30 ms (14 ms) | 10139 | 83 | 36 MiB | 35 MiB |
| nft | 10000 × 10 | 3.58 s (3.21 s) | 118 ms (92 ms) | 101445 | 813 | 197 MiB | 197 MiB |
| legacy | 10000 × 10 | 1.22 s (0.92 s) | 539 ms (512 ms) | 101445 | 813 | 197 MiB | 197 MiB |

| mode | Services × endpoints | full load into empty maps (CPU) | the same entries, bare batch updates (CPU) | one endpoint changed | full resync, nothing changed | services entries | backends | map memory |
|---|---|---|---|---|---|---|---|---|
| ebpf | 10000 × 10 | 0.210 s (0.156 s) | 0.099 s (0.090 s) | 0.108 ms | 0.228 s | 109991 | 99991 | 81.8 MiB |

| mode | proxyd | Services × endpoints | RSS after the first full sync | after 5 more full syncs | first sync after start | rounds (MiB, first / later) |
|---|---|---|---|---|---|---|
| ebpf | bin/proxyd | 10000 × 10 | 71 MiB | 89 MiB | 7.5 s | 71 77 71 / 89 95 89 |
| iptables | bin/proxyd | 10000 × 10 | 96 MiB | 151 MiB | 9.7 s | 97 96 96 / 151 151 150 |

| mode | phase | node: Services | to | connect p50 | connect p99 | p50 of each round (µs) |
|---|---|---|---|---|---|---|
| ebpf | floor | node1: 10 | ClusterIP | 100.0 µs | 320.0 µs | 100 100 |
| ebpf | scale | node1: 10 | ClusterIP | 101.0 µs | 327.8 µs | 101 101 |
| ebpf | scale | node2: 10000 | ClusterIP | 102.8 µs | 326.2 µs | 103 102 |
| ebpf | scale | node1: 10 | pod IP directly | 99.6 µs | 318.1 µs | 99 100 |
| ebpf | scale | node2: 10000 | pod IP directly | 101.9 µs | 337.8 µs | 102 101 |

| mode | phase (node1 / node2 Services) | ratio | p50, median of the rounds' (range) | p99, same | target |
|---|---|---|---|---|---|
| ebpf | floor, 5 rounds (10 / 10) | ClusterIP node2 / ClusterIP node1 | 1.004× (0.99–1.01) | 1.175× (1.04–1.31) | — |
| ebpf | scale, 9 rounds (10 / 10000) | ClusterIP node2 / ClusterIP node1 | 1.000× (0.98–1.02) | 0.958× (0.84–1.16) | ≤ 1.05× |
| ebpf | scale, 9 rounds (10 / 10000) | ClusterIP / pod IP, node2 | 1.008× (1.00–1.02) | 0.986× (0.83–1.01) | ≤ 1.1× |

load average ebpf: before 4.3 4.0 3.9, after 4.5 4.1 4.0

| mode | path | TCP throughput, median of 12 × 2 s | rounds (Gbit/s) |
|---|---|---|---|
| ebpf | pod IP directly | 7.14 Gbit/s | 7.1 7.2 |
| ebpf | ClusterIP | 7.05 Gbit/s | 7.0 7.1 |
| ebpf | NodePort from outside | 6.92 Gbit/s | 6.9 7.0 |
| iptables | NodePort from outside | 6.23 Gbit/s | 6.2 6.3 |

| mode | path | turn-taking stream (podnet-lab stream), median of 12 × 2 s | TCP_RR round trips/s, same | stream rounds (Gbit/s) | TCP_RR rounds |
|---|---|---|---|---|---|
| ebpf | pod IP directly | 5.22 Gbit/s | 31058 | 5.2 5.3 | 31000 31100 |
| ebpf | ClusterIP | 5.26 Gbit/s | 31905 | 5.2 5.3 | 31900 31910 |
| iptables | pod IP directly | 5.19 Gbit/s | 29088 | 5.1 5.2 | 29000 29100 |
| iptables | ClusterIP | 5.15 Gbit/s | 26990 | 5.1 5.2 | 26900 27000 |

| mode | ratio | median of the rounds' (range), all 12 rounds | ebpf on node1 | ebpf on node2 | target |
|---|---|---|---|---|---|
| ebpf | stream in turns, ClusterIP / pod IP | 0.953× (0.88–1.08) | 0.95× (0.9–1.0) | 0.96× (0.9–1.0) | ≥ 0.97× |
| ebpf | TCP_RR, ClusterIP / pod IP | 1.014× (0.98–1.05) | 1.01× (1.0–1.0) | 1.02× (1.0–1.1) | ≥ 0.97× |
| ebpf | throughput, NodePort from outside, ebpf / iptables | 0.921× (0.75–1.19) | 0.9× (0.8–1.0) | 1.0× (0.9–1.2) | — |
| iptables | stream in turns, ClusterIP / pod IP | 1.033× (0.84–1.11) | 1.0× (0.8–1.1) | 1.0× (0.9–1.1) | ≥ 0.97× |
| iptables | TCP_RR, ClusterIP / pod IP | 0.921× (0.88–0.96) | 0.92× (0.9–1.0) | 0.92× (0.9–1.0) | ≥ 0.97× |
`

const dns1000Out = `## 1000 Services from kube-apiserver, 10s per run, servers on CPU 1, dnsperf on CPU 0

| server | RSS before the runs |
|---|---:|
| dnsd | 37.3 MiB (Go heap in use 11.0 MiB) |
| coredns | 68.4 MiB |

| mix | server | QPS (100 in flight) | server CPU per query | server busy | client core busy | avg latency (100 in flight) | median latency (1 in flight) |
|---|---|---:|---:|---:|---:|---:|---:|
| cluster | dnsd | 124886 | 7.5 µs | 94 % | 97 % | 0.471 ms | 0.109 ms |
| cluster | coredns | 64160 | 15.5 µs | 99 % | 79 % | 1.515 ms | 0.165 ms |
| cluster | echodns | 128940 | 6.9 µs | 89 % | 98 % | 0.366 ms | 0.122 ms |
| nxdomain | dnsd | 148241 | 6.2 µs | 91 % | 99 % | 0.280 ms | 0.107 ms |
| nxdomain | coredns | 70357 | 14.1 µs | 99 % | 80 % | 1.389 ms | 0.147 ms |
`

const dns10000Out = `## 10000 Services from kube-apiserver, 10s per run, servers on CPU 1, dnsperf on CPU 0, CoreDNS 1.14.2

| server | RSS before the runs |
|---|---:|
| dnsd | 118.9 MiB (Go heap in use 88.5 MiB) |
| coredns | 145.2 MiB |
`

const goOut = `goos: linux
pkg: github.com/podnet/podnet/dataplane/routing
BenchmarkApplyAtScale/host-gw/first_program-2         	       3	 619000000 ns/op	       619.0 program-ms	       737.0 bare-ms	       767.0 watched-ms
BenchmarkApplyAtScale/host-gw/resync-2                	      40	  29000000 ns/op
BenchmarkApplyAtScale/vxlan/first_program-2           	       3	1046000000 ns/op	      1046 program-ms	      1566 bare-ms	      1086 watched-ms
pkg: github.com/podnet/podnet/e2e
BenchmarkKubeSourceRSS-2   	       1	400000000000 ns/op	        88.00 compact-RSS-MiB	        57.00 compact-heap-MiB	       105.0 full-RSS-MiB	        76.00 full-heap-MiB
`

var testMeta = Meta{Date: "2026-11-27 17:05 UTC", Commit: "abc1234", Load: "1.50 1.20 1.00", IPTables: "iptables v1.8.9 (nf_tables)"}

const testWhen = "2026-11-27 17:05 UTC (load 1.50)"

// rowOf returns the row of measure id (and mode, when the lab names it).
func rowOf(t *testing.T, rows []Row, id, mode string) Row {
	t.Helper()
	m := byID(id)
	if mode == "" {
		mode = m.mode
	}
	for _, r := range rows {
		if r.Measure == m.measure && r.Mode == mode {
			return r
		}
	}
	t.Fatalf("no row %s (%s %s) in %+v", id, m.measure, mode, rows)
	return Row{}
}

func check(t *testing.T, r Row, podnet, anchor, ratio string) {
	t.Helper()
	if r.Podnet != podnet || r.AnchorFigure != anchor || r.Ratio != ratio {
		t.Errorf("%s / %s: got %q, %q, %q; want %q, %q, %q", r.Measure, r.Mode, r.Podnet, r.AnchorFigure, r.Ratio, podnet, anchor, ratio)
	}
	if r.Date != testWhen || r.Commit != testMeta.Commit {
		t.Errorf("%s: run %q, %q; want the meta's", r.Measure, r.Date, r.Commit)
	}
}

func TestExtractCNI(t *testing.T) {
	rows := Extract("cni", cniOut, testMeta)
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want 4: %+v", len(rows), rows)
	}
	check(t, rowOf(t, rows, "cni-add-seq", ""), "27.1 ms", "35.7 ms", "0.76× (podnet ÷ reference, same run)")
	check(t, rowOf(t, rows, "cni-del-20", ""), "228.9 ms", "227.1 ms", "1.01× (podnet ÷ reference, same run)")
}

func TestExtractRouting(t *testing.T) {
	rows := Extract("routing", routingOut, testMeta)
	check(t, rowOf(t, rows, "pod-hostgw", ""), "10.48 Gbit/s", "13.59 Gbit/s", "0.77× (of bare, medians of the rounds)")
	check(t, rowOf(t, rows, "pod-vxlan", ""), "8.47 Gbit/s", "13.59 Gbit/s", "0.62× (of bare, medians of the rounds)")
}

func TestExtractServices(t *testing.T) {
	rows := Extract("services", servicesOut, testMeta)
	check(t, rowOf(t, rows, "full-nft", ""), "3.58 s (3.21 s) (CPU of iptables in brackets)", "not finished in 20 min (issue 5; not this run)", "—")
	check(t, rowOf(t, rows, "change-legacy", ""), "539 ms (512 ms)", "2.0–2.2 s (issue 5; not this run)", "—")
	check(t, rowOf(t, rows, "full-ebpf", ""), "0.210 s (0.156 s) (CPU in brackets)", "11–13 s (issue 5; not this run)", "—")
	check(t, rowOf(t, rows, "change-ebpf", ""), "0.108 ms", "2.0–2.2 s (issue 5; not this run)", "—")
	check(t, rowOf(t, rows, "rss-ebpf", ""), "71 / 89 MiB", "308 MiB (issue 13; not this run)", "—")
	check(t, rowOf(t, rows, "rss-nft", "iptables-nft"), "96 / 151 MiB", "308 MiB (issue 13; not this run)", "—")
	check(t, rowOf(t, rows, "connect-scale-ebpf", ""), "102.8 µs", "101.0 µs", "1.000× (0.98–1.02), median of the rounds' ratios")
	check(t, rowOf(t, rows, "connect-pod-ebpf", ""), "102.8 µs", "101.9 µs", "1.008× (1.00–1.02), median of the rounds' ratios")
	check(t, rowOf(t, rows, "rr-ebpf", ""), "31905", "31058", "1.014× (0.98–1.05), median of the rounds' ratios")
	check(t, rowOf(t, rows, "stream-nft", "iptables-nft"), "5.15 Gbit/s", "5.19 Gbit/s", "1.033× (0.84–1.11), median of the rounds' ratios")
	check(t, rowOf(t, rows, "nodeport-ebpf", ""), "6.92 Gbit/s", "6.23 Gbit/s (iptables-nft)", "0.921× (0.75–1.19), median of the rounds' ratios")
	// The 1,000-Service rows and the iptables lock-step (not in the
	// sample) make no rows.
	for _, r := range rows {
		if strings.Contains(r.Podnet, "0.34 s") || (r.Measure == byID("connect-scale-nft").measure && r.Mode != "ebpf") {
			t.Errorf("unexpected row %+v", r)
		}
	}
}

func TestExtractServicesLegacyLab(t *testing.T) {
	m := testMeta
	m.IPTables = "iptables v1.8.9 (legacy)"
	rows := Extract("services", servicesOut, m)
	check(t, rowOf(t, rows, "rss-nft", "iptables-legacy"), "96 / 151 MiB", "308 MiB (issue 13; not this run)", "—")
}

func TestExtractDNS(t *testing.T) {
	rows := Extract("dns-1000", dns1000Out, testMeta)
	check(t, rowOf(t, rows, "dns-qps-cluster", ""), "124886", "64160", "1.95× (dnsd ÷ CoreDNS, same run)")
	check(t, rowOf(t, rows, "dns-cpu-nxdomain", ""), "6.2 µs", "14.1 µs", "2.27× (CoreDNS ÷ dnsd, same run)")
	check(t, rowOf(t, rows, "dns-ceil-cluster", ""), "124886", "128940", "0.97× (dnsd ÷ echodns, same run)")
	for _, r := range rows {
		if r.Measure == byID("dns-ceil-nxdomain").measure || r.Measure == byID("dns-rss").measure {
			t.Errorf("a row without its figures: %+v", r)
		}
	}
	rows = Extract("dns-10000", dns10000Out, testMeta)
	if len(rows) != 1 {
		t.Fatalf("10,000 Services: got %+v, want the RSS row alone", rows)
	}
	check(t, rows[0], "118.9 MiB (Go heap in use 88.5 MiB)", "145.2 MiB", "0.82× (dnsd ÷ CoreDNS, same run)")
	// A run names the CoreDNS it measured; one that does not predates the
	// header and used 1.15.0.
	if rows[0].Anchor != "CoreDNS 1.14.2" {
		t.Errorf("10,000 Services, a run of CoreDNS 1.14.2: anchor %q", rows[0].Anchor)
	}
	if r := rowOf(t, Extract("dns-1000", dns1000Out, testMeta), "dns-qps-cluster", ""); r.Anchor != "CoreDNS 1.15.0" {
		t.Errorf("1,000 Services, a run without a version: anchor %q", r.Anchor)
	}
}

func TestExtractGo(t *testing.T) {
	rows := Extract("go", goOut, testMeta)
	check(t, rowOf(t, rows, "routes-hostgw", ""), "619.0 ms", "737.0 ms", "0.84× (podnet ÷ floor, same run)")
	check(t, rowOf(t, rows, "routes-vxlan", ""), "1046 ms", "1566 ms", "0.67× (podnet ÷ floor, same run)")
	check(t, rowOf(t, rows, "kube-rss", ""), "88.00 MiB", "105.0 MiB", "0.84× (podnet ÷ informers, same run)")
}

func TestExtractNothingFromOtherOutput(t *testing.T) {
	for _, part := range []string{"cni", "routing", "services", "dns-1000", "go", "unknown"} {
		if rows := Extract(part, "FAIL\nsomething went wrong\n", testMeta); len(rows) != 0 {
			t.Errorf("%s: got %+v from a failed run", part, rows)
		}
	}
}

func TestTSVRoundTrip(t *testing.T) {
	rows := Extract("cni", cniOut, testMeta)
	var buf bytes.Buffer
	if err := WriteTSV(&buf, rows); err != nil {
		t.Fatal(err)
	}
	got, err := ReadTSV("x", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rows) || got[0] != rows[0] || got[3] != rows[3] {
		t.Errorf("round trip: got %+v, want %+v", got, rows)
	}
	if _, err := ReadTSV("bad.tsv", strings.NewReader("a\tb\n")); err == nil || !strings.Contains(err.Error(), "bad.tsv:1: header") {
		t.Errorf("a wrong header: err %v, want one naming the file and line", err)
	}
	if _, err := ReadTSV("short.tsv", strings.NewReader(strings.Join(tsvHeader, "\t")+"\na\tb\n")); err == nil || !strings.Contains(err.Error(), "short.tsv:2: 2 fields") {
		t.Errorf("a short line: err %v", err)
	}
	bad := rows[0]
	bad.Podnet = "a\tb"
	if err := WriteTSV(&bytes.Buffer{}, []Row{bad}); err == nil {
		t.Error("a tab inside a field was written")
	}
}

const doc = `# Benchmarks

Intro.

<!-- summary:begin -->
| measure | podnet mode | podnet | anchor | anchor's figure | ratio | command | run (date, commit) |
|---|---|---|---|---|---|---|---|
| DNS QPS, 100 in flight, cluster names, 1,000 Services | all | 124,886 | CoreDNS 1.15.0 | 64,160 | 1.95× | ` + "`scripts/bench-dns.sh 1000 10`" + ` | 2026-11-22 14:30 UTC, d622f96 |
| CNI ADD, median, one at a time | all | 27.1 ms | bridge + host-local v1.9.1 | 35.7 ms | 24 % lower | ` + "`scripts/bench-cni.sh`" + ` | 2026-11-22, recorded in 2639a0e |
| something by hand | x | 1 \| 2 | y | 3 | — | by hand | 2026-11-20, 0000000 |
<!-- summary:end -->

## CNI
`

func TestRewrite(t *testing.T) {
	news := Extract("routing", routingOut, testMeta)
	news = append(news, rowOf(t, Extract("cni", cniOut, testMeta), "cni-add-seq", ""))
	out, rows, err := Rewrite(doc, news)
	if err != nil {
		t.Fatal(err)
	}
	// Catalogue order; the DNS row kept as it was; the unknown row last.
	var got []string
	for _, r := range rows {
		got = append(got, r.Measure+" "+r.Mode+" "+r.Podnet+" "+r.Commit)
	}
	want := []string{
		"CNI ADD, median, one at a time all 27.1 ms abc1234",
		"pod → pod on another node, one TCP stream host-gw 10.48 Gbit/s abc1234",
		"pod → pod on another node, one TCP stream VXLAN 8.47 Gbit/s abc1234",
		"DNS QPS, 100 in flight, cluster names, 1,000 Services all 124,886 d622f96",
		"something by hand x 1 | 2 0000000",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(out, "# Benchmarks\n\nIntro.\n\n"+beginMarker+"\n| measure |") || !strings.HasSuffix(out, endMarker+"\n\n## CNI\n") {
		t.Errorf("text around the table changed:\n%s", out)
	}
	if !strings.Contains(out, "| 2026-11-27 17:05 UTC (load 1.50), abc1234 |") || !strings.Contains(out, `| 1 \| 2 |`) {
		t.Errorf("table:\n%s", out)
	}
	// Nothing new: the same document again.
	again, _, err := Rewrite(out)
	if err != nil || again != out {
		t.Errorf("a rewrite without results changed the document (err %v):\n%s", err, again)
	}
	if _, _, err := Rewrite("no markers here"); err == nil {
		t.Error("a document without markers was accepted")
	}
}

// Every row of BENCHMARKS.md's summary is one the catalogue knows, so a run
// that measures it replaces it instead of adding a second row.
func TestBenchmarksSummaryRowsAreInTheCatalogue(t *testing.T) {
	b, err := os.ReadFile("../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _, err := splitSummary(string(b))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range catalogue {
		known[Row{Measure: m.measure, Mode: m.mode}.key()] = true
	}
	if len(rows) == 0 {
		t.Fatal("the summary has no rows")
	}
	for _, r := range rows {
		if !known[r.key()] {
			t.Errorf("summary row %q / %q is not in the catalogue", r.Measure, r.Mode)
		}
	}
}

func TestExtractDir(t *testing.T) {
	dir := t.TempDir()
	meta := "date\t" + testMeta.Date + "\ncommit\t" + testMeta.Commit + "\nload\t" + testMeta.Load + "\niptables\t" + testMeta.IPTables + "\n"
	for name, s := range map[string]string{"meta.tsv": meta, "cni.out": cniOut, "dns-10000.out": dns10000Out} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := extractDir(dir); err != nil {
		t.Fatal(err)
	}
	rows, err := readTSVFile(filepath.Join(dir, "results.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 5 {
		t.Errorf("got %d rows, want 4 CNI + 1 DNS: %+v", len(rows), rows)
	}
	for _, r := range rows {
		if r.Date != testWhen || r.Commit != testMeta.Commit {
			t.Errorf("%s: run %q, %q; want meta.tsv's date, load and commit", r.Measure, r.Date, r.Commit)
		}
	}
	os.WriteFile(filepath.Join(dir, "meta.tsv"), []byte("load\t1\n"), 0o644)
	if err := extractDir(dir); err == nil || !strings.Contains(err.Error(), "want date and commit") {
		t.Errorf("meta without date: err %v", err)
	}
}
