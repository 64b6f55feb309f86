package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/e2e/lab"
)

// dsClusterIP and dsNodePort are the test Service's frontends per family.
var dsClusterIP = map[ipfamily.Family]netip.Addr{
	ipfamily.IPv4: netip.MustParseAddr("10.96.0.50"),
	ipfamily.IPv6: netip.MustParseAddr("fd00:10:96::50"),
}

const dsNodePort = 30450

// TestDualStack runs one lab cluster of each kind (IPv4-only, dual-stack,
// IPv6-only: pods, nodes' InternalIPs and the underlay of those families;
// IPv6 addresses all unique local) with proxyd in each proxy mode, iptables
// and ebpf, on every node, and checks per family: node.json (podCIDRs, the MTU of VXLAN over
// the first family: 1450 over IPv4, 1430 over IPv6), a pod on every node
// reaching the pods of the others (host-gw on segment A, VXLAN to node4 on
// segment B), pods reaching the outside masqueraded to their node's
// address, and a Service of the cluster's families (one cluster IP per
// family, an EndpointSlice per address type) reached on each cluster IP
// from pods of two nodes and on each family's NodePort from outside;
// then externalTrafficPolicy Local, sessionAffinity ClientIP,
// internalTrafficPolicy Local and loadBalancerSourceRanges, each per family.
func TestDualStack(t *testing.T) {
	for _, mode := range []string{"iptables", "ebpf"} {
		for _, c := range []struct {
			name string
			fams []ipfamily.Family
		}{
			{"ipv4", []ipfamily.Family{ipfamily.IPv4}},
			{"dual", []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}},
			{"ipv6", []ipfamily.Family{ipfamily.IPv6}},
		} {
			t.Run(mode+"/"+c.name, func(t *testing.T) { testDualStack(t, mode, c.fams) })
		}
	}
}

func testDualStack(t *testing.T, mode string, fams []ipfamily.Family) {
	l := lab.Start(t, lab.Options{Families: fams})
	ctx := t.Context()
	var cidrs []string
	for _, p := range l.ClusterCIDRs() {
		cidrs = append(cidrs, p.String())
	}
	procs := map[*lab.Node]*lab.Proc{}
	for _, n := range l.Nodes {
		p, err := n.StartProxyd(ctx, "--cluster-cidr", strings.Join(cidrs, ","), "--proxy-mode", mode,
			"--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112",
			"--healthz-bind-address", rtHealthAddr, "--metrics-bind-address", "127.0.0.1:10249",
			"--sync-period", "2s", "--min-sync-period", "100ms")
		if err != nil {
			t.Fatal(err)
		}
		procs[n] = p
	}
	// Pods are probed once every node's network has synced, routes and all.
	for n, p := range procs {
		waitProxydReady(t, n, p)
	}
	wantMTU := lab.UnderlayMTU - 50
	if fams[0] == ipfamily.IPv6 {
		wantMTU = lab.UnderlayMTU - 70
	}
	for _, n := range l.Nodes {
		cfg, err := nodeconfig.Read(n.NodeConfigPath())
		if err != nil || !slices.Equal(cfg.Pods(), n.PodCIDRs()) || cfg.MTU != wantMTU {
			t.Fatalf("%s: node config %+v (%v), want podCIDRs %v and MTU %d", n.Name, cfg, err, n.PodCIDRs(), wantMTU)
		}
	}
	pods := map[string]*lab.Pod{}
	for _, n := range l.Nodes {
		p, err := n.AddPod(ctx, "p"+strings.TrimPrefix(n.Name, "node"))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.IPs) != len(fams) {
			t.Fatalf("pod on %s got %v, want one address per family %v", n.Name, p.IPs, fams)
		}
		if _, err := p.StartEcho(lab.EchoOptions{TCP: []string{":9090"}}); err != nil {
			t.Fatal(err)
		}
		pods[n.Name] = p
	}
	for _, f := range fams {
		dsPodToPod(t, l, pods, f)
	}
	dsOutside(t, l, pods["node4"], fams)
	dsService(t, l, pods, fams)
}

// dsPodToPod pings from every pod every other pod's address of f.
func dsPodToPod(t *testing.T, l *lab.Lab, pods map[string]*lab.Pod, f ipfamily.Family) {
	t.Helper()
	for _, from := range l.Nodes {
		for _, to := range l.Nodes {
			if from == to {
				continue
			}
			dst := pods[to.Name].IPOf(f)
			// One Ping, as for IPv4: a first IPv6 contact once waited a
			// second or more while a link-local address was tentative (no
			// neighbour solicitation is sent from a device without a usable
			// one); podnet's bridge and the lab's links now skip DAD.
			if _, err := lab.Ping(t.Context(), pods[from.Name].NSPath(), dst); err != nil {
				t.Errorf("%v: pod on %s -> pod on %s (%s): %v", f, from.Name, to.Name, dst, err)
			}
		}
	}
}

// dsOutside checks that pod p reaches the outside over each family,
// masqueraded to its node's address of that family.
func dsOutside(t *testing.T, l *lab.Lab, p *lab.Pod, fams []ipfamily.Family) {
	t.Helper()
	if _, err := l.OutsideHost.StartEcho(lab.EchoOptions{TCP: []string{":7070"}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		dst, node := l.OutsideIP, p.Node.IP
		if f == ipfamily.IPv6 {
			dst, node = l.OutsideIP6, p.Node.IP6
		}
		out, err := dsPod(p)(netip.AddrPortFrom(dst, 7070))
		if _, from := svcAnswer(out); err != nil || from != node {
			t.Errorf("%v: pod on %s -> outside %s: %q (%v), want an answer seeing the node's %s", f, p.Node.Name, dst, out, err, node)
		}
	}
}

// dsService writes a Service of the cluster's families and checks it on
// each cluster IP from the pods on node3 (segment A) and node4 (segment
// B), and on each family's NodePort of node1 from outside.
func dsService(t *testing.T, l *lab.Lab, pods map[string]*lab.Pod, fams []ipfamily.Family) {
	t.Helper()
	svc := dsSvc{name: "ds", ip4: dsClusterIP[ipfamily.IPv4].String(), ip6: dsClusterIP[ipfamily.IPv6].String(), nodePort: dsNodePort}
	if err := l.WriteState("svc-ds.yaml", svc.yaml(t, fams, pods["node1"], pods["node2"])); err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		vip := netip.AddrPortFrom(dsClusterIP[f], 80)
		for _, client := range []*lab.Pod{pods["node3"], pods["node4"]} {
			dsEventuallyServes(t, dsPod(client), vip, "p1", "p2")
		}
		nodeIP := l.Node("node1").IP
		if f == ipfamily.IPv6 {
			nodeIP = l.Node("node1").IP6
		}
		dsEventuallyServes(t, dsNS(l.OutsideHost.NSPath()), netip.AddrPortFrom(nodeIP, dsNodePort), "p1", "p2")
		// Hairpin: p1 reaches itself through the cluster IP too.
		dsEventuallyServes(t, dsPod(pods["node1"]), vip, "p1", "p2")
	}
	dsLocal(t, l, pods, fams)
	dsAffinityAndInternalLocal(t, l, pods, fams)
	dsSourceRanges(t, l, pods, fams)
}

// dsLBIngress is the load-balancer IP of dsSourceRanges' Service per family.
var dsLBIngress = map[ipfamily.Family]string{ipfamily.IPv4: "192.0.2.60", ipfamily.IPv6: "fd00:10:97::60"}

// dsSourceRanges checks per family a LoadBalancer Service whose
// loadBalancerSourceRanges hold p3's address alone: its load-balancer IP
// serves p3 (node3) and refuses p4 (node4).
func dsSourceRanges(t *testing.T, l *lab.Lab, pods map[string]*lab.Pod, fams []ipfamily.Family) {
	t.Helper()
	d := dsSvc{name: "dslb", ip4: "10.96.0.54", ip6: "fd00:10:96::54", nodePort: 30455, lbIngress: dsLBIngress}
	for _, f := range fams {
		p3 := pods["node3"].IPOf(f)
		d.sourceRanges = append(d.sourceRanges, netip.PrefixFrom(p3, p3.BitLen()).String())
	}
	if err := l.WriteState("svc-dslb.yaml", d.yaml(t, fams, pods["node1"], pods["node2"])); err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		lbAddr := netip.AddrPortFrom(netip.MustParseAddr(dsLBIngress[f]), 80)
		dsEventuallyServes(t, dsPod(pods["node3"]), lbAddr, "p1", "p2")
		if out, err := dsPod(pods["node4"])(lbAddr); err == nil {
			t.Errorf("%v: load-balancer IP %s answered %q to p4, outside loadBalancerSourceRanges %v", f, lbAddr, out, d.sourceRanges)
		}
	}
}

// dsAffinityAndInternalLocal checks per family sessionAffinity ClientIP
// (every probe of a pod lands on one endpoint) and internalTrafficPolicy
// Local (a pod reaches only its own node's endpoint).
func dsAffinityAndInternalLocal(t *testing.T, l *lab.Lab, pods map[string]*lab.Pod, fams []ipfamily.Family) {
	t.Helper()
	aff := dsSvc{name: "dsaff", ip4: "10.96.0.52", ip6: "fd00:10:96::52", nodePort: 30453, affinity: true}
	itp := dsSvc{name: "dsitp", ip4: "10.96.0.53", ip6: "fd00:10:96::53", nodePort: 30454, internalLocal: true}
	for _, d := range []dsSvc{aff, itp} {
		if err := l.WriteState("svc-"+d.name+".yaml", d.yaml(t, fams, pods["node1"], pods["node2"])); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range fams {
		for _, client := range []*lab.Pod{pods["node3"], pods["node4"]} {
			dsEventuallyOneEndpoint(t, dsPod(client), netip.AddrPortFrom(netip.MustParseAddr(aff.ip(f)), 80))
		}
		for _, n := range []string{"node1", "node2"} {
			dsEventuallyServes(t, dsPod(pods[n]), netip.AddrPortFrom(netip.MustParseAddr(itp.ip(f)), 80), pods[n].Name)
		}
	}
}

// dsEventuallyOneEndpoint waits until 12 probes in a row of addr from
// nsPath all answer, from one server alone.
func dsEventuallyOneEndpoint(t *testing.T, from dsClient, addr netip.AddrPort) {
	t.Helper()
	var seen map[string]int
	var lastErr error
	deadline := time.Now().Add(svcTimeout)
	for time.Now().Before(deadline) {
		seen, lastErr = map[string]int{}, nil
		for range 12 {
			out, err := from(addr)
			if err != nil {
				lastErr = err
				break
			}
			name, _ := svcAnswer(out)
			seen[name]++
		}
		if lastErr == nil && len(seen) == 1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s with ClientIP affinity: answered by %v (last error %v), want one endpoint for all", addr, seen, lastErr)
}

// dsLocal checks externalTrafficPolicy Local per family: node1's NodePort
// answers from p1 alone (node1's endpoint), seeing the outside client's
// own address, not the node's.
func dsLocal(t *testing.T, l *lab.Lab, pods map[string]*lab.Pod, fams []ipfamily.Family) {
	t.Helper()
	svc := dsSvc{name: "dslocal", ip4: "10.96.0.51", ip6: "fd00:10:96::51", nodePort: 30451, local: true}
	if err := l.WriteState("svc-dslocal.yaml", svc.yaml(t, fams, pods["node1"], pods["node2"])); err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		nodeIP, client := l.Node("node1").IP, l.OutsideIP
		if f == ipfamily.IPv6 {
			nodeIP, client = l.Node("node1").IP6, l.OutsideIP6
		}
		addr := netip.AddrPortFrom(nodeIP, 30451)
		dsEventuallyServes(t, dsNS(l.OutsideHost.NSPath()), addr, "p1")
		out, err := dsProbe(l.OutsideHost.NSPath(), addr)
		if _, from := svcAnswer(out); err != nil || from != client {
			t.Errorf("%v: eTP Local NodePort %s: %q (%v), want the client's own %s seen", f, addr, out, err, client)
		}
	}
}

// dsSvc is a NodePort Service with a cluster IP of each family (ip4,
// ip6), externalTrafficPolicy Local when local.
type dsSvc struct {
	name, ip4, ip6 string
	nodePort       int
	local          bool
	affinity       bool // sessionAffinity ClientIP
	internalLocal  bool // internalTrafficPolicy Local
	// type LoadBalancer with these ingress IPs, per family, when set
	lbIngress    map[ipfamily.Family]string
	sourceRanges []string // loadBalancerSourceRanges
}

// ip is the Service's cluster IP of family f.
func (d dsSvc) ip(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return d.ip6
	}
	return d.ip4
}

// yaml is the Service with one cluster IP per family of fams
// (RequireDualStack with two) and one EndpointSlice per address type, the
// web pods ready in each.
func (d dsSvc) yaml(t *testing.T, fams []ipfamily.Family, web ...*lab.Pod) string {
	t.Helper()
	var ips, names []string
	for _, f := range fams {
		ips, names = append(ips, d.ip(f)), append(names, f.String())
	}
	policy := "SingleStack"
	if len(fams) == 2 {
		policy = "RequireDualStack"
	}
	spec := map[string]any{"type": "NodePort", "clusterIP": ips[0], "clusterIPs": ips, "ipFamilies": names, "ipFamilyPolicy": policy,
		"ports": []any{map[string]any{"name": "tcp", "protocol": "TCP", "port": 80, "targetPort": 9090, "nodePort": d.nodePort}}}
	if d.local {
		spec["externalTrafficPolicy"], spec["healthCheckNodePort"] = "Local", d.nodePort+1
	}
	if d.affinity {
		spec["sessionAffinity"] = "ClientIP"
		spec["sessionAffinityConfig"] = map[string]any{"clientIP": map[string]any{"timeoutSeconds": 600}}
	}
	if d.internalLocal {
		spec["internalTrafficPolicy"] = "Local"
	}
	svc := map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": d.name, "namespace": "default"},
		"spec":     spec,
	}
	if d.lbIngress != nil {
		var ingress []any
		for _, f := range fams {
			ingress = append(ingress, map[string]any{"ip": d.lbIngress[f]})
		}
		spec["type"], spec["loadBalancerSourceRanges"] = "LoadBalancer", d.sourceRanges
		svc["status"] = map[string]any{"loadBalancer": map[string]any{"ingress": ingress}}
	}
	objs := []any{svc}
	for _, f := range fams {
		var eps []any
		for _, w := range web {
			eps = append(eps, map[string]any{"addresses": []string{w.IPOf(f).String()}, "conditions": map[string]any{"ready": true, "serving": true},
				"nodeName": w.Node.Name, "targetRef": map[string]any{"kind": "Pod", "name": w.Name, "namespace": "default"}})
		}
		objs = append(objs, map[string]any{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": f.String(),
			"metadata": map[string]any{"name": d.name + "-" + strings.ToLower(f.String()), "namespace": "default",
				"labels": map[string]any{"kubernetes.io/service-name": d.name}},
			"ports": []any{map[string]any{"name": "tcp", "protocol": "TCP", "port": 9090}}, "endpoints": eps,
		})
	}
	b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": objs})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dsClient makes one TCP probe of an address.
type dsClient func(netip.AddrPort) (string, error)

// dsPod probes from pod p with a real process in its node's cgroup, where
// ebpf mode's socket LB serves it as it serves the pod's own processes.
func dsPod(p *lab.Pod) dsClient {
	return func(addr netip.AddrPort) (string, error) {
		return p.Probe(context.Background(), "tcp", addr.String())
	}
}

// dsNS probes from the namespace at nsPath (a host outside the cluster).
func dsNS(nsPath string) dsClient {
	return func(addr netip.AddrPort) (string, error) { return dsProbe(nsPath, addr) }
}

// dsProbe makes one TCP probe of addr from the namespace at nsPath.
func dsProbe(nsPath string, addr netip.AddrPort) (string, error) {
	var out string
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		out, err = lab.Probe(context.Background(), "tcp", addr.String(), 2*time.Second)
		return err
	})
	return out, err
}

// dsEventuallyServes waits until 12 probes in a row of addr from nsPath
// all answer, from exactly the servers in want.
func dsEventuallyServes(t *testing.T, from dsClient, addr netip.AddrPort, want ...string) {
	t.Helper()
	var last map[string]int
	var lastErr error
	deadline := time.Now().Add(svcTimeout)
	for time.Now().Before(deadline) {
		seen := map[string]int{}
		lastErr = nil
		for range 12 {
			out, err := from(addr)
			if err != nil {
				lastErr = err
				break
			}
			name, _ := svcAnswer(out)
			seen[name]++
		}
		last = seen
		if lastErr == nil && len(seen) == len(want) && seen[want[0]] > 0 && seen[want[len(want)-1]] > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: answered by %v (last error %v), want exactly %v", addr, last, lastErr, fmt.Sprint(want))
}
