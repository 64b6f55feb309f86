package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mdns "github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/e2e/lab"
)

// Scenario 6 of `make soak`: a simulated cluster of 5,000 Nodes and 10,000
// Services × 10 endpoints in the state directory, read by one proxyd (and
// then one dnsd) on a lab node whose underlay is a /16, so that every peer
// can be reached with host-gw as well as with VXLAN. Goals (issue 15): all
// routes programmed in ≤ 2 s, one Node added or removed applied in ≤ 50 ms,
// proxyd RSS ≤ 150 MiB in iptables mode, dnsd RSS ≤ 49 MB + 0.86 KB per
// object (CoreDNS's published figure, objects = Services + endpoints).

// Goals of scenario 6.
const (
	scaleRoutesGoal     = 2 * time.Second
	scaleNodeChangeGoal = 50 * time.Millisecond
	scaleProxydRSSGoal  = 150 << 20 // bytes
)

// scaleDnsdRSSGoal is CoreDNS's published memory figure for objects
// Services and endpoints, in bytes.
func scaleDnsdRSSGoal(objects int) int { return 49e6 + objects*860 }

// scaleCluster is the simulated cluster.
type scaleCluster struct {
	nodes, services, endpoints int
}

// Addresses of the simulated cluster: node i has 172.16.0.0/16 + 11 + i
// and podCIDR 10.128.0.0/10's i-th /24; Service s is 10.96.1.0 + s with
// namespace ns-(s%100); its j-th endpoint, k = 10s+j, runs on node k%nodes.
var (
	scaleClusterCIDR = netip.MustParsePrefix("10.128.0.0/10")
	scaleUnderlay    = netip.MustParsePrefix("172.16.0.0/16")
)

func scaleAddr(base netip.Addr, offset int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(offset)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func scaleNodeIP(i int) netip.Addr { return scaleAddr(scaleUnderlay.Addr(), 11+i) }

func scalePodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(scaleAddr(scaleClusterCIDR.Addr(), i*256), 24)
}

func scaleNodeName(i int) string {
	if i < 2 {
		return fmt.Sprintf("node%d", i+1) // the lab's own nodes
	}
	return fmt.Sprintf("scale-%05d", i)
}

func scaleVIP(s int) netip.Addr { return scaleAddr(netip.MustParseAddr("10.96.1.0"), s) }

func scaleNamespace(s int) string { return fmt.Sprintf("ns-%02d", s%100) }

// nodeYAML is one Node as kubectl prints it (the fields podnet reads).
func scaleNodeYAML(i int) string {
	return fmt.Sprintf("---\napiVersion: v1\nkind: Node\nmetadata: {name: %s, labels: {kubernetes.io/hostname: %s}}\nspec: {podCIDR: %s, podCIDRs: [%s]}\nstatus: {addresses: [{type: InternalIP, address: %s}, {type: Hostname, address: %s}]}\n",
		scaleNodeName(i), scaleNodeName(i), scalePodCIDR(i), scalePodCIDR(i), scaleNodeIP(i), scaleNodeName(i))
}

// write generates the state files: the peers (the lab writes node1 and
// node2 itself), the namespaces and the Services with their slices.
func (c scaleCluster) write(l *lab.Lab) error {
	var y strings.Builder
	for i := 2; i < c.nodes; i++ {
		y.WriteString(scaleNodeYAML(i))
	}
	if err := l.WriteState("scale-nodes.yaml", y.String()); err != nil {
		return err
	}
	y.Reset()
	for n := range 100 {
		fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", scaleNamespace(n))
	}
	for s := range c.services {
		vip := scaleVIP(s)
		fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: %s}\nspec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]}\n",
			s, scaleNamespace(s), vip, vip)
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata: {name: s%05d-x, namespace: %s, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: http, protocol: TCP, port: 8080}]\nendpoints:\n",
			s, scaleNamespace(s), s)
		for j := range c.endpoints {
			k := s*c.endpoints + j
			node := k % c.nodes
			ip := scaleAddr(scalePodCIDR(node).Addr(), 2+k/c.nodes)
			fmt.Fprintf(&y, "- {addresses: [%s], conditions: {ready: true}, nodeName: %s}\n", ip, scaleNodeName(node))
		}
	}
	return l.WriteState("scale-services.yaml", y.String())
}

// TestSoakScale is scenario 6: a proxyd programs the routes to every peer
// (host-gw on node1, then VXLAN on node2, each from an empty node) and the
// Services; one Node is added and removed five times; then a dnsd serves
// the same state. make test runs it with 500 Nodes and 1,000 Services.
// PODNET_SCALE_DNSD=bin1,bin2,… runs only the dnsd part, once with each
// dnsd binary in turn ("." is $PODNET_BIN's), to compare builds side by side.
func TestSoakScale(t *testing.T) {
	roottest.Require(t)
	c := scaleCluster{nodes: soakSize(500, 5000), services: soakSize(1000, 10000), endpoints: 10}
	l := lab.Start(t, lab.Options{Nodes: []lab.NodeSpec{
		{Name: "node1", IP: netip.PrefixFrom(scaleNodeIP(0), 16), PodCIDR: scalePodCIDR(0)},
		{Name: "node2", IP: netip.PrefixFrom(scaleNodeIP(1), 16), PodCIDR: scalePodCIDR(1)},
	}})
	if err := c.write(l); err != nil {
		t.Fatal(err)
	}
	if bins := os.Getenv("PODNET_SCALE_DNSD"); bins != "" {
		scaleDnsdOnly(t, l, c, strings.Split(bins, ","))
		return
	}
	var figures []string
	var rss, peak []int
	for i, backend := range []string{"host-gw", "vxlan"} {
		r := scaleProxyd(t, l, l.Nodes[i], c, backend)
		rss, peak = append(rss, r.rss), append(peak, r.peakRSS)
		figures = append(figures, fmt.Sprintf("%s: %d routes%s in %s (%.1f s from start), one Node added/removed %s/%s median (apply; %s/%s until in the kernel), Services %.2f s",
			backend, c.nodes-1, map[string]string{"vxlan": " + neigh + FDB"}[backend], msStr(r.routes), r.ready.Seconds(),
			msStr(median(r.addSync)), msStr(median(r.delSync)), msStr(median(r.addSeen)), msStr(median(r.delSeen)), r.services.Seconds()))
		if r.routes > scaleRoutesGoal {
			t.Errorf("%s: routes to %d peers programmed in %v, goal %v", backend, c.nodes-1, r.routes, scaleRoutesGoal)
		}
		for _, d := range []time.Duration{median(r.addSync), median(r.delSync)} {
			if d > scaleNodeChangeGoal {
				t.Errorf("%s: one Node change applied in %v (median), goal %v", backend, d, scaleNodeChangeGoal)
			}
		}
		if r.rss > scaleProxydRSSGoal {
			t.Errorf("%s: proxyd RSS %d MiB, goal %d MiB", backend, r.rss>>20, scaleProxydRSSGoal>>20)
		}
	}
	d := scaleDnsd(t, l, c, filepath.Join(l.BinDir, "dnsd"))
	objects := c.services * (1 + c.endpoints)
	goal := scaleDnsdRSSGoal(objects)
	if d.rss > goal {
		t.Errorf("dnsd RSS %.1f MB, goal %.1f MB (49 MB + 0.86 KB × %d)", float64(d.rss)/1e6, float64(goal)/1e6, objects)
	}
	figures = append(figures, fmt.Sprintf("proxyd RSS %d/%d MiB (iptables mode; host-gw/vxlan run; %d/%d MiB at the end of the first sync)", rss[0]>>20, rss[1]>>20, peak[0]>>20, peak[1]>>20),
		fmt.Sprintf("dnsd RSS %d MiB (goal %d MiB), answer p50 %s p99 %s (%d queries, 1 in flight)",
			d.rss>>20, goal>>20, usStr(d.p50), usStr(d.p99), d.queries))
	soakRow(t, "6 scale, simulated",
		fmt.Sprintf("%d Nodes, %d Services × %d endpoints (state directory)", c.nodes, c.services, c.endpoints),
		fmt.Sprintf("one Node added and removed %d times per backend", scaleRounds()), "0 (every route, neighbour and FDB entry checked; every DNS answer checked)",
		strings.Join(figures, "; "))
}

// scaleRounds is how often one Node is added and removed: the medians of
// 3 (make test) or 5 (make soak) are asserted, so one sync delayed by the
// box's other work does not fail the goal.
func scaleRounds() int { return soakSize(3, 5) }

func msStr(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
func usStr(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// scaleResult is what one proxyd run measured.
type scaleResult struct {
	ready  time.Duration // start to routes and Services programmed
	routes time.Duration // the first node network sync
	// routesOnly is its routing part (sysctls and chains go beside it).
	routesOnly time.Duration
	services   time.Duration // the first full Service sync
	// RSS when the first syncs were done, and 5 s later.
	peakRSS, rss int
	// One Node added and removed: the sync's own time, and the time from
	// the file's change to the route's event from the kernel.
	addSync, delSync, addSeen, delSeen []time.Duration
	// fullSyncs counts the Node changes that met a full sync (the
	// periodic one, or one netlink asked for) rather than an update.
	fullSyncs int
}

// scaleProxyd runs proxyd with backend on n until every peer and Service is
// programmed, checks the kernel holds it all, then adds and removes one
// Node five times.
func scaleProxyd(t *testing.T, l *lab.Lab, n *lab.Node, c scaleCluster, backend string) scaleResult {
	t.Helper()
	var r scaleResult
	start := time.Now()
	// Not StartProxyd: reading the state takes longer than its wait for
	// the node config.
	p, err := n.Start("proxyd", filepath.Join(l.BinDir, "proxyd"), "--node-name", n.Name, "--state-dir", l.StateDir(),
		"--node-config", n.NodeConfigPath(), "--bpf-cgroup", n.BPFCgroup(), "--bpf-pin-dir", n.BPFPinDir(),
		"--backend", backend, "--cluster-cidr", scaleClusterCIDR.String(),
		"--log-format", "json", "--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Errorf("proxyd: %v", err)
		}
	}()
	deadline := time.Now().Add(time.Duration(soakSize(2, 10)) * time.Minute)
	for {
		code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
		if err == nil && code == 200 {
			fams := metricstest.Parse(t, body)
			peers, _ := metricstest.Value(fams, "podnet_peers", "backend", backend)
			ports, _ := metricstest.Value(fams, "podnet_proxy_service_ports")
			full, _ := metricstest.Value(fams, "kubeproxy_sync_full_proxy_rules_duration_seconds")
			synced := scaleSyncs(p.Output())
			if int(peers) == c.nodes-1 && int(ports) >= c.services && full >= 1 && len(synced) > 0 {
				r.ready = time.Since(start)
				r.peakRSS = procRSS(strconv.Itoa(p.Pid())) << 10
				sum := fams["kubeproxy_sync_full_proxy_rules_duration_seconds"].Metric[0].GetHistogram().GetSampleSum()
				r.services = time.Duration(sum / full * 1e9)
				r.routes, r.routesOnly = synced[0].took, synced[0].routes
				if synced[0].changes < c.nodes-1 {
					t.Errorf("first node network sync made %d changes, want at least %d", synced[0].changes, c.nodes-1)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not programmed in time (metrics: %v)\n%s", backend, err, lastLines(p.Output(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	h, nsh := scaleNetlink(t, n)
	scaleCheckKernel(t, h, c, n, backend)
	// After its first full sync proxyd returns the start-up garbage to
	// the system; the goal is for what it holds from then on.
	time.Sleep(5 * time.Second)
	r.rss = procRSS(strconv.Itoa(p.Pid())) << 10

	events := make(chan netlink.RouteUpdate, 1024)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeWithOptions(events, done, netlink.RouteSubscribeOptions{Namespace: &nsh}); err != nil {
		t.Fatal(err)
	}
	extra := c.nodes + 10 // an index no other node has
	want := scalePodCIDR(extra)
	for range scaleRounds() {
		for _, add := range []bool{true, false} {
			// Past --min-sync-period (1 s), so that each change is a sync
			// of its own.
			time.Sleep(time.Duration(soakSize(1500, 2500)) * time.Millisecond)
			before := len(scaleSyncs(p.Output()))
			drain(events)
			at := time.Now()
			var err error
			if add {
				err = l.WriteState("scale-extra.yaml", scaleNodeYAML(extra))
			} else {
				err = l.RemoveState("scale-extra.yaml")
			}
			if err != nil {
				t.Fatal(err)
			}
			seen, err := waitRoute(events, want, add, at)
			if err != nil {
				t.Fatalf("%s: node added %v: %v\n%s", backend, add, err, lastLines(p.Output(), 20))
			}
			var sync scaleSync
			for wait := time.Now().Add(5 * time.Second); ; {
				if s := scaleSyncs(p.Output()); len(s) > before {
					sync = s[before]
					break
				}
				if time.Now().After(wait) {
					t.Fatalf("%s: no sync logged after the Node change", backend)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if sync.full {
				r.fullSyncs++
			}
			if add {
				r.addSync, r.addSeen = append(r.addSync, sync.took), append(r.addSeen, seen)
			} else {
				r.delSync, r.delSeen = append(r.delSync, sync.took), append(r.delSeen, seen)
			}
		}
	}
	scaleCheckKernel(t, h, c, n, backend)
	t.Logf("%s: ready %v, routes %v (routing part %v), Services %v, RSS %d MiB (%d MiB at the first sync), Node added %v (seen %v), removed %v (seen %v), %d of them by a full sync",
		backend, r.ready, r.routes, r.routesOnly, r.services, r.rss>>20, r.peakRSS>>20, r.addSync, r.addSeen, r.delSync, r.delSeen, r.fullSyncs)
	return r
}

func drain(ch chan netlink.RouteUpdate) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// waitRoute waits up to 10 s for the kernel's event adding (or deleting)
// the route to dst and returns how long after since it came.
func waitRoute(events <-chan netlink.RouteUpdate, dst netip.Prefix, add bool, since time.Time) (time.Duration, error) {
	const timeout = 10 * time.Second
	want := uint16(unix.RTM_NEWROUTE)
	if !add {
		want = unix.RTM_DELROUTE
	}
	deadline := time.After(timeout)
	for {
		select {
		case u := <-events:
			if u.Type != want || u.Dst == nil {
				continue
			}
			ip, _ := netip.AddrFromSlice(u.Dst.IP)
			ones, _ := u.Dst.Mask.Size()
			if netip.PrefixFrom(ip.Unmap(), ones) == dst {
				return time.Since(since), nil
			}
		case <-deadline:
			return 0, fmt.Errorf("no route event for %s within %v", dst, timeout)
		}
	}
}

// scaleSync is one "node network synced" line of proxyd's log.
type scaleSync struct {
	changes int
	took    time.Duration
	full    bool          // compared everything with the kernel
	routes  time.Duration // of a full sync: the routing part
}

func scaleSyncs(out string) []scaleSync {
	var s []scaleSync
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"node network synced"`) {
			continue
		}
		var e struct {
			Changes int   `json:"changes"`
			Took    int64 `json:"took"`
			Full    bool  `json:"full"`
			Routes  int64 `json:"routes"`
		}
		if json.Unmarshal([]byte(line), &e) == nil {
			s = append(s, scaleSync{e.Changes, time.Duration(e.Took), e.Full, time.Duration(e.Routes)})
		}
	}
	return s
}

func scaleNetlink(t *testing.T, n *lab.Node) (*netlink.Handle, netns.NsHandle) {
	t.Helper()
	nsh, err := netns.GetFromPath(n.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsh.Close() })
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, nsh
}

// scaleCheckKernel checks that the node holds a route to every peer, and
// with VXLAN a neighbour and an FDB entry for each.
func scaleCheckKernel(t *testing.T, h *netlink.Handle, c scaleCluster, n *lab.Node, backend string) {
	t.Helper()
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: routing.Protocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	have := make(map[netip.Prefix]bool)
	for _, r := range routes {
		ip, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		have[netip.PrefixFrom(ip.Unmap(), ones)] = true
	}
	self := slices.IndexFunc([]int{0, 1}, func(i int) bool { return scaleNodeName(i) == n.Name })
	missing := 0
	for i := range c.nodes {
		if i != self && !have[scalePodCIDR(i)] {
			missing++
		}
	}
	if missing > 0 || len(routes) != c.nodes-1 {
		t.Errorf("%s: %d routes, %d peers without one (want %d routes)", backend, len(routes), missing, c.nodes-1)
	}
	if backend != "vxlan" {
		return
	}
	dev, err := h.LinkByName(routing.DefaultDevice)
	if err != nil {
		t.Fatal(err)
	}
	neighs, err := h.NeighList(dev.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	fdb, err := h.NeighList(dev.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	perm, dst := 0, 0
	for _, e := range neighs {
		if e.State&netlink.NUD_PERMANENT != 0 {
			perm++
		}
	}
	for _, e := range fdb {
		if len(e.IP) > 0 {
			dst++
		}
	}
	if perm != c.nodes-1 || dst != c.nodes-1 {
		t.Errorf("vxlan: %d permanent neighbours and %d FDB entries, want %d each", perm, dst, c.nodes-1)
	}
}

// dnsdResult is what the dnsd run measured.
type dnsdResult struct {
	rss int
	// heap is the Go heap's allocated bytes (live, the GC of the start-up
	// garbage just done) and its spans in use, when RSS is read.
	heapAlloc, heapInuse int
	p50, p99             time.Duration
	queries              int
}

// scaleDnsd runs dnsd on node1 over the same state, waits until it is
// ready, reads its RSS and times queries for random Services, one in
// flight, checking every answer.
func scaleDnsd(t *testing.T, l *lab.Lab, c scaleCluster, bin string) dnsdResult {
	t.Helper()
	n := l.Nodes[0]
	p, err := n.Start("dnsd", bin, "--state-dir", l.StateDir(), "--listen", "127.0.0.1:53",
		"--upstream", "127.0.0.1:5399", "--metrics-address", "127.0.0.1:9153", "--health-address", "", "--ready-address", "127.0.0.1:8181")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Errorf("dnsd: %v", err)
		}
	}()
	for deadline := time.Now().Add(5 * time.Minute); ; {
		if code, _, err := svcHTTPGet(n.NSPath(), "127.0.0.1:8181/ready"); err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dnsd not ready within 5 minutes\n%s", lastLines(p.Output(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Once ready, dnsd returns the garbage of the load to the system; RSS
	// is read when that is done.
	time.Sleep(5 * time.Second)
	var r dnsdResult
	r.rss = procRSS(strconv.Itoa(p.Pid())) << 10
	if _, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:9153/metrics"); err == nil {
		fams := metricstest.Parse(t, body)
		alloc, _ := metricstest.Value(fams, "go_memstats_heap_alloc_bytes")
		inuse, _ := metricstest.Value(fams, "go_memstats_heap_inuse_bytes")
		r.heapAlloc, r.heapInuse = int(alloc), int(inuse)
	}
	r.queries = soakSize(500, 2000)
	var took []time.Duration
	err = ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		conn, err := net.Dial("udp", "127.0.0.1:53")
		if err != nil {
			return err
		}
		defer conn.Close()
		dc := &mdns.Conn{Conn: conn}
		for q := range r.queries {
			s := rand.IntN(c.services)
			name := fmt.Sprintf("s%05d.%s.svc.cluster.local.", s, scaleNamespace(s))
			m := new(mdns.Msg)
			m.SetQuestion(name, mdns.TypeA)
			m.Id = uint16(q)
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			start := time.Now()
			if err := dc.WriteMsg(m); err != nil {
				return err
			}
			resp, err := dc.ReadMsg()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			took = append(took, time.Since(start))
			if len(resp.Answer) != 1 {
				return fmt.Errorf("%s: %d answers, rcode %s", name, len(resp.Answer), mdns.RcodeToString[resp.Rcode])
			}
			if a, ok := resp.Answer[0].(*mdns.A); !ok || a.A.String() != scaleVIP(s).String() {
				return fmt.Errorf("%s: answer %s, want %s", name, resp.Answer[0], scaleVIP(s))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dnsd: %v", err)
	}
	slices.Sort(took)
	r.p50, r.p99 = took[len(took)/2], took[len(took)*99/100]
	t.Logf("dnsd: RSS %d MiB, p50 %v, p99 %v", r.rss>>20, r.p50, r.p99)
	return r
}

// scaleDnsdOnly runs only the dnsd part, once with each dnsd binary given
// (PODNET_SCALE_DNSD=bin1,bin2,...; "." is $PODNET_BIN's), in turn, so that
// two builds are measured side by side on the same state and box.
func scaleDnsdOnly(t *testing.T, l *lab.Lab, c scaleCluster, bins []string) {
	goal := scaleDnsdRSSGoal(c.services * (1 + c.endpoints))
	for _, bin := range bins {
		if bin == "." {
			bin = filepath.Join(l.BinDir, "dnsd")
		}
		d := scaleDnsd(t, l, c, bin)
		t.Logf("%s: dnsd RSS %d MiB (goal %d MiB; heap allocated %d MiB, spans in use %d MiB), answer p50 %s p99 %s",
			bin, d.rss>>20, goal>>20, d.heapAlloc>>20, d.heapInuse>>20, usStr(d.p50), usStr(d.p99))
		if d.rss > goal {
			t.Errorf("%s: dnsd RSS %.1f MB, goal %.1f MB", bin, float64(d.rss)/1e6, float64(goal)/1e6)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
