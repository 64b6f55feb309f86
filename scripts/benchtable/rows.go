package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Row is one line of the summary table: one measure of podnet in one mode
// against one anchor, from one run.
type Row struct {
	Measure      string
	Mode         string
	Podnet       string
	Anchor       string
	AnchorFigure string
	Ratio        string
	Command      string
	Date         string
	Commit       string
}

// key identifies a row across runs: a newer run's row replaces the older
// one with the same measure and mode.
func (r Row) key() string { return r.Measure + "\x00" + r.Mode }

// measure is a catalogue entry: what a row measures and against what. Its
// order is the table's.
type measure struct {
	id, measure, mode, anchor, command string
}

const (
	cmdCNI       = "`scripts/bench-cni.sh`"
	cmdRouting   = "`scripts/bench-routing.sh`"
	cmdServices  = "`scripts/bench-services.sh`"
	cmdApply     = "`go test -run '^$' -bench ApplyAtScale ./dataplane/routing/`"
	cmdLockstep  = "`scripts/bench-services.sh` (`BenchmarkClusterIPConnectLockstep`)"
	cmdTput      = "`scripts/bench-services.sh` (`BenchmarkServiceThroughput`)"
	cmdRSS       = "`scripts/bench-services.sh` (`BenchmarkProxydRSS`)"
	cmdDNS1000   = "`scripts/bench-dns.sh 1000 10`"
	cmdDNS10000  = "`scripts/bench-dns.sh 10000 10`"
	cmdKubeRSS   = "`go test -run '^$' -bench KubeSourceRSS -benchtime 1x ./e2e/`"
	modeAll      = "all"
	anchorCNI    = "bridge + host-local v1.9.1"
	anchorBare   = "bare veth pair"
	anchorKP     = "kube-proxy 1.36"
	anchorCoreDN = "CoreDNS 1.15.0"
)

// catalogue lists every row the table knows, in the table's order. Rows
// without an extractor (measured by hand) keep the figures BENCHMARKS.md
// holds until someone replaces them by hand.
var catalogue = []measure{
	{"cni-add-seq", "CNI ADD, median, one at a time", modeAll, anchorCNI, cmdCNI},
	{"cni-add-20", "CNI ADD, median, 20 at a time", modeAll, anchorCNI, cmdCNI},
	{"cni-del-seq", "CNI DEL, median, one at a time", modeAll, anchorCNI, cmdCNI},
	{"cni-del-20", "CNI DEL, median, 20 at a time", modeAll, anchorCNI, cmdCNI},
	{"pod-hostgw", "pod → pod on another node, one TCP stream", "host-gw", anchorBare, cmdRouting},
	{"pod-vxlan", "pod → pod on another node, one TCP stream", "VXLAN", anchorBare, cmdRouting},
	{"underlay", "node → node over the lab underlay (the lab's ceiling)", "no podnet", anchorBare, "by hand in `make demo KEEP=1`, iperf3"},
	{"flannel", "pod → pod on another node, against flannel", "host-gw / VXLAN", "flannel", "—"},
	{"routes-hostgw", "routes to 4,999 peers into an empty node", "host-gw", "one library call per object, no reconciler", cmdApply},
	{"routes-vxlan", "routes to 4,999 peers into an empty node", "VXLAN", "one library call per object, no reconciler", cmdApply},
	{"full-nft", "full sync, 10,000 Services × 10 endpoints", "iptables-nft", anchorKP + " iptables-nft", cmdServices},
	{"full-legacy", "full sync, 10,000 Services × 10 endpoints", "iptables-legacy", anchorKP + " iptables-legacy", cmdServices},
	{"full-ebpf", "full sync, 10,000 Services × 10 endpoints", "ebpf", anchorKP + " iptables-legacy (its fastest)", cmdServices},
	{"change-nft", "one endpoint changed at 10,000 Services", "iptables-nft", anchorKP + " iptables-nft", cmdServices},
	{"change-legacy", "one endpoint changed at 10,000 Services", "iptables-legacy", anchorKP + " iptables-legacy", cmdServices},
	{"change-ebpf", "one endpoint changed at 10,000 Services", "ebpf", anchorKP + " iptables-legacy (its fastest)", cmdServices},
	{"connect-scale-ebpf", "ClusterIP connect p50 at 10,000 Services against 10", "ebpf", "the same at 10 Services", cmdLockstep},
	{"connect-scale-nft", "ClusterIP connect p50 at 10,000 Services against 10", "iptables-nft", "the same at 10 Services", cmdLockstep},
	{"connect-pod-ebpf", "ClusterIP connect p50 at 10,000 Services against the pod IP", "ebpf", "connect to the pod IP directly", cmdLockstep},
	{"connect-pod-nft", "ClusterIP connect p50 at 10,000 Services against the pod IP", "iptables-nft", "connect to the pod IP directly", cmdLockstep},
	{"rr-ebpf", "TCP_RR through a ClusterIP, round trips/s", "ebpf", "the pod IP directly", cmdTput},
	{"rr-nft", "TCP_RR through a ClusterIP, round trips/s", "iptables-nft", "the pod IP directly", cmdTput},
	{"stream-ebpf", "TCP stream through a ClusterIP, in turns", "ebpf", "the pod IP directly", cmdTput},
	{"stream-nft", "TCP stream through a ClusterIP, in turns", "iptables-nft", "the pod IP directly", cmdTput},
	{"nodeport-ebpf", "NodePort from outside, iperf3", "ebpf", "iptables mode, same round", cmdTput},
	{"rss-ebpf", "proxyd RSS, 10,000 Services × 10: first sync / 5 more", "ebpf", anchorKP, cmdRSS},
	{"rss-nft", "proxyd RSS, 10,000 Services × 10: first sync / 5 more", "iptables-nft", anchorKP, cmdRSS},
	{"kube-rss", "API source RSS, 10,000 Services × 10 endpoints", modeAll, "client-go informers, whole objects", cmdKubeRSS},
	{"dns-qps-cluster", "DNS QPS, 100 in flight, cluster names, 1,000 Services", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-qps-nxdomain", "DNS QPS, 100 in flight, search-path misses, 1,000 Services", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-qps-cached", "DNS QPS, 100 in flight, cached forwarded names, 1,000 Services", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-cpu-cluster", "DNS server CPU per query, cluster names", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-cpu-nxdomain", "DNS server CPU per query, search-path misses", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-cpu-cached", "DNS server CPU per query, cached forwarded names", modeAll, anchorCoreDN, cmdDNS1000},
	{"dns-ceil-cluster", "DNS QPS, cluster names, against the ceiling", modeAll, "echodns (answers without a lookup)", cmdDNS1000},
	{"dns-ceil-nxdomain", "DNS QPS, search-path misses, against the ceiling", modeAll, "echodns (answers without a lookup)", cmdDNS1000},
	{"dns-ceil-cached", "DNS QPS, cached forwarded names, against the ceiling", modeAll, "echodns (answers without a lookup)", cmdDNS1000},
	{"dns-rss", "DNS server RSS, 10,000 Services × 3 endpoints, synced", modeAll, anchorCoreDN, cmdDNS10000},
	// Measured by the e2e and unit tests that show issue 20's behaviour.
	{"dns-nodelocal-gap", "DNS answer gap on a node when its dnsd dies, node-local", "iptables-nft", "CoreDNS + NodeLocal DNSCache", "`go test -run TestDnsdNodeLocal ./e2e/`"},
	{"dns-nodelocal-share", "DNS queries answered on the querying pod's node, node-local", "iptables-nft", "CoreDNS + NodeLocal DNSCache", "`go test -run TestDnsdNodeLocal ./e2e/`"},
	{"dns-autopath", "DNS queries on the wire per external name from an ndots:5 pod", modeAll, "no autopath (the client walks its search path)", "`go test -run TestAutopathQueriesOnTheWire ./dataplane/dns/`"},
	{"dns-race-nft", "parallel A+AAAA lookups over 1 s (4 clients, 10 s)", "iptables-nft", "kube-proxy + CoreDNS baseline", "`go test -run TestDnsdParallelAAndAAAA ./e2e/`"},
	{"dns-race-ebpf", "parallel A+AAAA lookups over 1 s (4 clients, 10 s)", "ebpf", "kube-proxy + CoreDNS baseline", "`go test -run TestDnsdParallelAAndAAAA ./e2e/`"},
}

func byID(id string) measure {
	for _, m := range catalogue {
		if m.id == id {
			return m
		}
	}
	panic("benchtable: no measure " + id)
}

// row makes the catalogue's row id with a run's figures.
func row(id, podnet, anchorFigure, ratio string) Row {
	m := byID(id)
	return Row{Measure: m.measure, Mode: m.mode, Podnet: podnet, Anchor: m.anchor,
		AnchorFigure: anchorFigure, Ratio: ratio, Command: m.command}
}

var tsvHeader = []string{"measure", "mode", "podnet", "anchor", "anchor_figure", "ratio", "command", "date", "commit"}

func (r Row) fields() []string {
	return []string{r.Measure, r.Mode, r.Podnet, r.Anchor, r.AnchorFigure, r.Ratio, r.Command, r.Date, r.Commit}
}

func fromFields(f []string) Row {
	return Row{Measure: f[0], Mode: f[1], Podnet: f[2], Anchor: f[3], AnchorFigure: f[4],
		Ratio: f[5], Command: f[6], Date: f[7], Commit: f[8]}
}

// WriteTSV writes rows as tab-separated values under a header line.
func WriteTSV(w io.Writer, rows []Row) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, strings.Join(tsvHeader, "\t"))
	for _, r := range rows {
		f := r.fields()
		for i := range f {
			if strings.ContainsAny(f[i], "\t\n") {
				return fmt.Errorf("write results: %s: a tab or newline in %q", tsvHeader[i], f[i])
			}
		}
		fmt.Fprintln(bw, strings.Join(f, "\t"))
	}
	return bw.Flush()
}

// ReadTSV reads what WriteTSV wrote; name is for errors.
func ReadTSV(name string, rd io.Reader) ([]Row, error) {
	sc := bufio.NewScanner(rd)
	var rows []Row
	line := 0
	for sc.Scan() {
		line++
		f := strings.Split(sc.Text(), "\t")
		if line == 1 {
			if strings.Join(f, "\t") != strings.Join(tsvHeader, "\t") {
				return nil, fmt.Errorf("%s:1: header is %q, want %q", name, sc.Text(), strings.Join(tsvHeader, "\t"))
			}
			continue
		}
		if len(f) != len(tsvHeader) {
			return nil, fmt.Errorf("%s:%d: %d fields, want %d", name, line, len(f), len(tsvHeader))
		}
		rows = append(rows, fromFields(f))
	}
	if line == 0 {
		return nil, fmt.Errorf("%s: empty, want a header line", name)
	}
	return rows, sc.Err()
}

func readTSVFile(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTSV(path, f)
}

// The summary table lives between these two lines of BENCHMARKS.md.
const (
	beginMarker = "<!-- summary:begin -->"
	endMarker   = "<!-- summary:end -->"
)

var tableHeader = []string{"measure", "podnet mode", "podnet", "anchor", "anchor's figure", "ratio", "command", "run (date, commit)"}

// Render writes rows as the markdown summary table.
func Render(rows []Row) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(tableHeader, " | ") + " |\n")
	b.WriteString(strings.Repeat("|---", len(tableHeader)) + "|\n")
	for _, r := range rows {
		cells := []string{r.Measure, r.Mode, r.Podnet, r.Anchor, r.AnchorFigure, r.Ratio, r.Command, r.Date + ", " + r.Commit}
		for i := range cells {
			cells[i] = strings.ReplaceAll(cells[i], "|", `\|`)
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	return b.String()
}

// splitSummary returns what comes before the summary, the summary, and
// what comes after it.
func splitSummary(doc string) (before, table, after string, err error) {
	i := strings.Index(doc, beginMarker)
	j := strings.Index(doc, endMarker)
	if i < 0 || j < 0 || j < i {
		return "", "", "", errors.New("no " + beginMarker + " … " + endMarker + " pair, in that order")
	}
	i += len(beginMarker)
	return doc[:i], doc[i:j], doc[j:], nil
}

// ParseTable reads the rows of a summary table Render wrote.
func ParseTable(table string) ([]Row, error) {
	var rows []Row
	for n, line := range strings.Split(table, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := splitCells(line)
		if len(cells) != len(tableHeader) {
			return nil, fmt.Errorf("summary line %d: %d cells, want %d: %s", n+1, len(cells), len(tableHeader), line)
		}
		if cells[0] == tableHeader[0] {
			continue
		}
		date, commit, _ := strings.Cut(cells[7], ", ")
		rows = append(rows, Row{Measure: cells[0], Mode: cells[1], Podnet: cells[2], Anchor: cells[3],
			AnchorFigure: cells[4], Ratio: cells[5], Command: cells[6], Date: date, Commit: commit})
	}
	return rows, nil
}

// splitCells splits a markdown table line at its unescaped bars.
func splitCells(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// Merge lays each later set of rows over the earlier ones (same measure and
// mode: the later row wins) and orders the result as the catalogue does;
// rows the catalogue does not know follow in the order first seen.
func Merge(sets ...[]Row) []Row {
	latest := map[string]Row{}
	var order []string
	for _, set := range sets {
		for _, r := range set {
			if _, ok := latest[r.key()]; !ok {
				order = append(order, r.key())
			}
			latest[r.key()] = r
		}
	}
	var out []Row
	done := map[string]bool{}
	for _, m := range catalogue {
		k := Row{Measure: m.measure, Mode: m.mode}.key()
		if r, ok := latest[k]; ok && !done[k] {
			out = append(out, r)
			done[k] = true
		}
	}
	for _, k := range order {
		if !done[k] {
			out = append(out, latest[k])
			done[k] = true
		}
	}
	return out
}

// Rewrite returns doc with its summary table made of the rows it holds
// overlaid with results (in order, later wins).
func Rewrite(doc string, results ...[]Row) (string, []Row, error) {
	before, table, after, err := splitSummary(doc)
	if err != nil {
		return "", nil, err
	}
	seed, err := ParseTable(table)
	if err != nil {
		return "", nil, err
	}
	rows := Merge(append([][]Row{seed}, results...)...)
	return before + "\n" + Render(rows) + after, rows, nil
}
