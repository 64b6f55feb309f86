package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// A run's parts, each the output of one of scripts/bench.sh's steps, saved
// as PART.out in the run's directory. Each extractor picks the summary's
// figures out of what its benchmarks print; a figure a part did not print
// (a size not run, a mode not measured) makes no row, so the table keeps
// the earlier run's.

// mdTable is one markdown table of a benchmark's output.
type mdTable struct {
	header []string
	rows   [][]string
}

// tables returns the markdown tables in out, in order.
func tables(out string) []mdTable {
	var ts []mdTable
	in := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		if strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := splitCells(line)
		if !in {
			ts = append(ts, mdTable{header: cells})
			in = true
			continue
		}
		ts[len(ts)-1].rows = append(ts[len(ts)-1].rows, cells)
	}
	return ts
}

// find returns the tables whose header holds a cell containing col.
func find(ts []mdTable, col string) []mdTable {
	var out []mdTable
	for _, t := range ts {
		for _, h := range t.header {
			if strings.Contains(h, col) {
				out = append(out, t)
				break
			}
		}
	}
	return out
}

// lookup returns the first row of the tables whose leading cells are
// prefix, or nil.
func lookup(ts []mdTable, prefix ...string) []string {
	for _, t := range ts {
	rows:
		for _, r := range t.rows {
			if len(r) < len(prefix) {
				continue
			}
			for i, p := range prefix {
				if r[i] != p {
					continue rows
				}
			}
			return r
		}
	}
	return nil
}

var leadingNumber = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?`)

// number is the number a cell starts with ("27.1 ms" → 27.1).
func number(cell string) (float64, bool) {
	m := leadingNumber.FindString(strings.ReplaceAll(cell, ",", ""))
	if m == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(m, 64)
	return f, err == nil
}

// ratio is a / b as "0.76× (what)", or "—" when either is not a number.
func ratio(a, b, what string) string {
	x, ok1 := number(a)
	y, ok2 := number(b)
	if !ok1 || !ok2 || y == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f× (%s)", x/y, what)
}

// extractCNI reads scripts/bench-cni.sh's table of medians.
func extractCNI(out string) []Row {
	ts := find(tables(out), "bridge+host-local median")
	var rows []Row
	for _, c := range []struct{ id, op string }{
		{"cni-add-seq", "ADD sequential"}, {"cni-add-20", "ADD 20 at a time"},
		{"cni-del-seq", "DEL sequential"}, {"cni-del-20", "DEL 20 at a time"},
	} {
		if r := lookup(ts, c.op); len(r) == 5 {
			rows = append(rows, row(c.id, r[1], r[3], ratio(r[1], r[3], "podnet ÷ reference, same run")))
		}
	}
	return rows
}

var throughputLine = regexp.MustCompile(`median: bare veth ([0-9.]+) Gbit/s; host-gw ([0-9.]+) Gbit/s \(([0-9.]+) of bare\); vxlan ([0-9.]+) Gbit/s \(([0-9.]+) of bare\)`)

// extractRouting reads BenchmarkPodThroughput's line of medians.
func extractRouting(out string) []Row {
	m := throughputLine.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	bare := m[1] + " Gbit/s"
	return []Row{
		row("pod-hostgw", m[2]+" Gbit/s", bare, m[3]+"× (of bare, medians of the rounds)"),
		row("pod-vxlan", m[4]+" Gbit/s", bare, m[5]+"× (of bare, medians of the rounds)"),
	}
}

// The kube-proxy figures the issue that set the Service proxy's targets
// (issue 5) measured on this kind of machine; never in a run of ours.
const notThisRun = " (issue 5; not this run)"

var kubeProxy = map[string]string{
	"full-nft":      "not finished in 20 min" + notThisRun,
	"full-legacy":   "11–13 s" + notThisRun,
	"full-ebpf":     "11–13 s" + notThisRun,
	"change-nft":    "not measured (issue 5: its full sync never finished)",
	"change-legacy": "2.0–2.2 s" + notThisRun,
	"change-ebpf":   "2.0–2.2 s" + notThisRun,
}

// extractServices reads scripts/bench-services.sh's tables; lab is the
// name of the lab's iptables mode ("iptables-nft" on a box whose iptables
// is nf_tables).
func extractServices(out, lab string) []Row {
	ts := tables(out)
	var rows []Row
	sync := find(ts, "full sync (iptables CPU)")
	for _, b := range []string{"nft", "legacy"} {
		if r := lookup(sync, b, "10000 × 10"); len(r) >= 4 {
			rows = append(rows,
				row("full-"+b, r[2]+" (CPU of iptables in brackets)", kubeProxy["full-"+b], "—"),
				row("change-"+b, r[3], kubeProxy["change-"+b], "—"))
		}
	}
	if r := lookup(find(ts, "full load into empty maps"), "ebpf", "10000 × 10"); len(r) >= 5 {
		rows = append(rows,
			row("full-ebpf", r[2]+" (CPU in brackets)", kubeProxy["full-ebpf"], "—"),
			row("change-ebpf", r[4], kubeProxy["change-ebpf"], "—"))
	}
	rows = append(rows, extractRSS(ts, lab)...)
	rows = append(rows, extractLockstep(ts, lab)...)
	return append(rows, extractThroughput(ts, lab)...)
}

// modeOf maps a lab mode to the suffix of its catalogue ids, and names the
// row's mode.
func modeOf(mode, lab string) (suffix, name string) {
	if mode == "ebpf" {
		return "ebpf", "ebpf"
	}
	return "nft", lab
}

func extractRSS(ts []mdTable, lab string) []Row {
	var rows []Row
	for _, t := range find(ts, "RSS after the first full sync") {
		for _, r := range t.rows {
			if len(r) < 5 || r[2] != "10000 × 10" {
				continue
			}
			s, name := modeOf(r[0], lab)
			x := row("rss-"+s, strings.TrimSuffix(r[3], " MiB")+" / "+r[4], "308 MiB (issue 13; not this run)", "—")
			x.Mode = name
			rows = append(rows, x)
		}
	}
	return rows
}

// extractLockstep reads BenchmarkClusterIPConnectLockstep's tables: the
// p50s of the scale phase and the medians of the rounds' ratios.
func extractLockstep(ts []mdTable, lab string) []Row {
	figs := find(ts, "node: Services")
	ratios := find(ts, "phase (node1 / node2 Services)")
	var rows []Row
	for _, mode := range []string{"ebpf", "iptables"} {
		s, name := modeOf(mode, lab)
		big := lookupPrefix(figs, mode, "scale", "node2: ", "ClusterIP")
		small := lookupPrefix(figs, mode, "scale", "node1: ", "ClusterIP")
		pod := lookupPrefix(figs, mode, "scale", "node2: ", "pod IP directly")
		scale := lookupPrefix(ratios, mode, "scale", "ClusterIP node2 / ClusterIP node1")
		vsPod := lookupPrefix(ratios, mode, "scale", "ClusterIP / pod IP, node2")
		if big == nil || small == nil || pod == nil || scale == nil || vsPod == nil {
			continue
		}
		a := row("connect-scale-"+s, big[4], small[4], scale[3]+", median of the rounds' ratios")
		b := row("connect-pod-"+s, big[4], pod[4], vsPod[3]+", median of the rounds' ratios")
		a.Mode, b.Mode = name, name
		rows = append(rows, a, b)
	}
	return rows
}

// lookupPrefix is lookup with each cell matched by its prefix.
func lookupPrefix(ts []mdTable, prefix ...string) []string {
	for _, t := range ts {
	rows:
		for _, r := range t.rows {
			if len(r) < len(prefix) {
				continue
			}
			for i, p := range prefix {
				if !strings.HasPrefix(r[i], p) {
					continue rows
				}
			}
			return r
		}
	}
	return nil
}

// extractThroughput reads BenchmarkServiceThroughput's tables: the medians
// of the figures, and the medians of the rounds' ratios.
func extractThroughput(ts []mdTable, lab string) []Row {
	iperf := find(ts, "TCP throughput, median")
	turns := find(ts, "turn-taking stream")
	ratios := find(ts, "median of the rounds' (range), all")
	var rows []Row
	for _, mode := range []string{"ebpf", "iptables"} {
		s, name := modeOf(mode, lab)
		vip, pod := lookup(turns, mode, "ClusterIP"), lookup(turns, mode, "pod IP directly")
		rr, st := lookup(ratios, mode, "TCP_RR, ClusterIP / pod IP"), lookup(ratios, mode, "stream in turns, ClusterIP / pod IP")
		if len(vip) >= 4 && len(pod) >= 4 && rr != nil && st != nil {
			a := row("rr-"+s, vip[3], pod[3], rr[2]+", median of the rounds' ratios")
			b := row("stream-"+s, vip[2], pod[2], st[2]+", median of the rounds' ratios")
			a.Mode, b.Mode = name, name
			rows = append(rows, a, b)
		}
	}
	np, other := lookup(iperf, "ebpf", "NodePort from outside"), lookup(iperf, "iptables", "NodePort from outside")
	if r := lookup(ratios, "ebpf", "throughput, NodePort from outside, ebpf / iptables"); r != nil && np != nil && other != nil {
		rows = append(rows, row("nodeport-ebpf", np[2], other[2]+" ("+lab+")", r[2]+", median of the rounds' ratios"))
	}
	return rows
}

// corednsVersion is the CoreDNS version a bench-dns.sh run names in its
// header; runs before it named one used CoreDNS 1.15.0.
var corednsVersion = regexp.MustCompile(`(?m)^## .*, CoreDNS ([0-9][0-9.]*)$`)

// extractDNS reads one scripts/bench-dns.sh run: at 1,000 Services its
// QPS and CPU per query against CoreDNS and echodns, at 10,000 its memory,
// each CoreDNS row anchored on the version the run used.
func extractDNS(out string) []Row {
	rows := extractDNSFigures(out)
	if m := corednsVersion.FindStringSubmatch(out); m != nil {
		for i := range rows {
			if rows[i].Anchor == anchorCoreDN {
				rows[i].Anchor = "CoreDNS " + m[1]
			}
		}
	}
	return rows
}

// extractDNSFigures is extractDNS with the catalogue's anchors.
func extractDNSFigures(out string) []Row {
	ts := tables(out)
	var rows []Row
	if strings.Contains(out, "## 10000 Services") {
		rss := find(ts, "RSS before the runs")
		d, c := lookup(rss, "dnsd"), lookup(rss, "coredns")
		if d != nil && c != nil {
			rows = append(rows, row("dns-rss", d[1], c[1], ratio(d[1], c[1], "dnsd ÷ CoreDNS, same run")))
		}
		return rows
	}
	if !strings.Contains(out, "## 1000 Services") {
		return nil
	}
	mixes := find(ts, "server CPU per query")
	for _, mix := range []string{"cluster", "nxdomain", "cached"} {
		d, c, e := lookup(mixes, mix, "dnsd"), lookup(mixes, mix, "coredns"), lookup(mixes, mix, "echodns")
		if len(d) < 4 || len(c) < 4 {
			continue
		}
		rows = append(rows,
			row("dns-qps-"+mix, d[2], c[2], ratio(d[2], c[2], "dnsd ÷ CoreDNS, same run")),
			row("dns-cpu-"+mix, d[3], c[3], ratio(c[3], d[3], "CoreDNS ÷ dnsd, same run")))
		if len(e) >= 4 {
			rows = append(rows, row("dns-ceil-"+mix, d[2], e[2], ratio(d[2], e[2], "dnsd ÷ echodns, same run")))
		}
	}
	return rows
}

// goMetric returns the value of unit on the line of benchmark name (the
// GOMAXPROCS suffix ignored), or "".
func goMetric(out, name, unit string) string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != name && !strings.HasPrefix(f[0], name+"-")) {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i+1] == unit {
				return f[i]
			}
		}
	}
	return ""
}

// extractGo reads the figures of the summary from make bench's sweep of
// the Go benchmarks.
func extractGo(out string) []Row {
	var rows []Row
	for _, b := range []struct{ id, name string }{
		{"routes-hostgw", "BenchmarkApplyAtScale/host-gw/first_program"},
		{"routes-vxlan", "BenchmarkApplyAtScale/vxlan/first_program"},
	} {
		p, bare := goMetric(out, b.name, "program-ms"), goMetric(out, b.name, "bare-ms")
		if p != "" && bare != "" {
			rows = append(rows, row(b.id, p+" ms", bare+" ms", ratio(p, bare, "podnet ÷ floor, same run")))
		}
	}
	c, f := goMetric(out, "BenchmarkKubeSourceRSS", "compact-RSS-MiB"), goMetric(out, "BenchmarkKubeSourceRSS", "full-RSS-MiB")
	if c != "" && f != "" {
		rows = append(rows, row("kube-rss", c+" MiB", f+" MiB", ratio(c, f, "podnet ÷ informers, same run")))
	}
	return rows
}
