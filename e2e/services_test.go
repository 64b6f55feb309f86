package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/proxy"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/nodenet"
	ebpfmode "github.com/podnet/podnet/dataplane/proxy/ebpf"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// Tests of issues 5 and 13: proxyd turns Services into rules (iptables
// mode) or BPF map entries (ebpf mode) on every node. They mirror
// Kubernetes' Service e2e tests, from pods on the same node, on other nodes
// and from the outside namespace, and run once per mode, each on a lab of
// its own (four nodes, proxyd on each, two echo pods and three clients).
//
// Clients are sockets of this test process, made inside the client's
// network namespace and, for the moment they are created, inside its node's
// cgroup: that is where ebpf mode's socket hooks are attached, as for every
// process of a real node.

const (
	svcTCP     = "9090" // echo TCP port of the web pods
	svcUDP     = "5353" // echo UDP (and TCP) port of the web pods
	svcTimeout = 5 * time.Second
)

type svcCluster struct {
	t      *testing.T
	mode   string // --proxy-mode
	lab    *lab.Lab
	proxyd map[string]*lab.Proc
	web1   *lab.Pod // on node1
	web2   *lab.Pod // on node2
	c1     *lab.Pod // client on node1
	c3     *lab.Pod // client on node3
	c4     *lab.Pod // client on node4 (other segment)
}

func svcProxydArgs(l *lab.Lab, n *lab.Node, mode string) []string {
	return []string{
		filepath.Join(l.BinDir, "proxyd"),
		"--node-name", n.Name,
		"--state-dir", l.StateDir(),
		"--node-config", n.NodeConfigPath(),
		"--proxy-mode", mode,
		// Both modes get the node's own pin dir: iptables mode removes
		// ebpf mode's state at start and must never touch the host's.
		"--bpf-cgroup", n.BPFCgroup(),
		"--bpf-pin-dir", n.BPFPinDir(),
		"--healthz-bind-address", "127.0.0.1:10256",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--sync-period", "2s",
		"--min-sync-period", "100ms",
	}
}

func (c *svcCluster) startProxyd(n *lab.Node) {
	c.t.Helper()
	p, err := n.Start("proxyd", svcProxydArgs(c.lab, n, c.mode)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.proxyd[n.Name] = p
}

func svcStart(t *testing.T, mode string) *svcCluster {
	t.Helper()
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	c := &svcCluster{t: t, mode: mode, lab: l, proxyd: map[string]*lab.Proc{}}
	for _, n := range l.Nodes {
		c.startProxyd(n)
	}
	for _, n := range l.Nodes {
		waitUntil(t, 10*time.Second, func() bool { return svcFileExists(n.NodeConfigPath()) }, "node config of "+n.Name)
	}
	ctx := t.Context()
	add := func(node, name string) *lab.Pod {
		p, err := l.Node(node).AddPod(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	c.web1, c.web2 = add("node1", "web1"), add("node2", "web2")
	c.c1, c.c3, c.c4 = add("node1", "client1"), add("node3", "client3"), add("node4", "client4")
	for _, w := range []*lab.Pod{c.web1, c.web2} {
		if _, err := w.StartEcho(lab.EchoOptions{HTTP: []string{":8080"}, TCP: []string{":" + svcTCP, ":" + svcUDP}, UDP: []string{":" + svcUDP}}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func svcFileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cgroupOf is the cgroup of the node (or outside host) owning the
// namespace at nsPath.
func (c *svcCluster) cgroupOf(nsPath string) string {
	for _, n := range append(slices.Clone(c.lab.Nodes), c.lab.OutsideHost) {
		if n.NSPath() == nsPath {
			return n.Cgroup
		}
	}
	for _, p := range c.lab.Pods() {
		if p.NSPath() == nsPath {
			return p.Node.Cgroup
		}
	}
	c.t.Fatalf("no lab host or pod has namespace %s", nsPath)
	return ""
}

// inClient runs fn in the namespace at nsPath and its node's cgroup:
// sockets fn makes are the client's.
func (c *svcCluster) inClient(nsPath string, fn func() error) error {
	cg := c.cgroupOf(nsPath)
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		return lab.InCgroup(cg, fn)
	})
}

// probeIn runs lab.Probe ("tcp" or "udp") as a client in the namespace at
// nsPath.
func (c *svcCluster) probeIn(nsPath, proto, addr string, timeout time.Duration) (string, error) {
	var out string
	err := c.inClient(nsPath, func() error {
		var err error
		out, err = lab.Probe(context.Background(), proto, addr, timeout)
		return err
	})
	return out, err
}

// answer splits an echo answer into the server's name and the client
// address it saw.
func svcAnswer(s string) (name string, client netip.Addr) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return "", netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return f[0], netip.Addr{}
	}
	return f[0], ap.Addr()
}

// servers probes n times and returns how often each server answered; it
// fails the test on any error.
func (c *svcCluster) servers(t *testing.T, nsPath, proto, addr string, n int) map[string]int {
	t.Helper()
	seen := make(map[string]int)
	for range n {
		out, err := c.probeIn(nsPath, proto, addr, 2*time.Second)
		if err != nil {
			t.Fatalf("probe %s %s: %v", proto, addr, err)
		}
		name, _ := svcAnswer(out)
		seen[name]++
	}
	return seen
}

// eventuallyServes waits until probes of addr reach exactly the servers
// in want (checked over several probes).
func (c *svcCluster) eventuallyServes(t *testing.T, nsPath, proto, addr string, want ...string) {
	t.Helper()
	var last map[string]int
	var lastErr error
	deadline := time.Now().Add(svcTimeout)
	for time.Now().Before(deadline) {
		seen := make(map[string]int)
		lastErr = nil
		for range 12 {
			out, err := c.probeIn(nsPath, proto, addr, time.Second)
			if err != nil {
				lastErr = err
				break
			}
			name, _ := svcAnswer(out)
			seen[name]++
		}
		last = seen
		if lastErr == nil && len(seen) == len(want) {
			ok := true
			for _, w := range want {
				ok = ok && seen[w] > 0
			}
			if ok {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s %s: answered by %v (last error %v), want exactly %v", proto, addr, last, lastErr, want)
}

// Service and EndpointSlice YAML, as a control plane would write them.

type svcPort struct {
	name, proto  string
	port, target int
	nodePort     int
}

type svcEndpoint struct {
	pod                         *lab.Pod
	ready, serving, terminating bool
	// nodeName overrides the pod's node in the slice; "-" omits the field.
	nodeName string
}

func svcReady(p *lab.Pod) svcEndpoint { return svcEndpoint{pod: p, ready: true, serving: true} }

type svcDef struct {
	name, clusterIP, typ string
	ports                []svcPort
	affinity             int
	etpLocal, itpLocal   bool
	healthCheckNodePort  int
	endpoints            []svcEndpoint
	noSlice              bool
}

func (d svcDef) yaml(t *testing.T) string {
	t.Helper()
	typ := d.typ
	if typ == "" {
		typ = "ClusterIP"
	}
	var ports, epPorts []any
	for _, p := range d.ports {
		sp := map[string]any{"name": p.name, "protocol": p.proto, "port": p.port, "targetPort": p.target}
		if p.nodePort != 0 {
			sp["nodePort"] = p.nodePort
		}
		ports = append(ports, sp)
		epPorts = append(epPorts, map[string]any{"name": p.name, "protocol": p.proto, "port": p.target})
	}
	spec := map[string]any{"type": typ, "clusterIP": d.clusterIP, "clusterIPs": []string{d.clusterIP}, "ports": ports}
	if d.affinity > 0 {
		spec["sessionAffinity"] = "ClientIP"
		spec["sessionAffinityConfig"] = map[string]any{"clientIP": map[string]any{"timeoutSeconds": d.affinity}}
	} else {
		spec["sessionAffinity"] = "None"
	}
	if d.etpLocal {
		spec["externalTrafficPolicy"] = "Local"
		spec["healthCheckNodePort"] = d.healthCheckNodePort
	}
	if d.itpLocal {
		spec["internalTrafficPolicy"] = "Local"
	}
	objs := []any{map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": d.name, "namespace": "default"},
		"spec":     spec,
	}}
	if !d.noSlice {
		var eps []any
		for _, e := range d.endpoints {
			m := map[string]any{
				"addresses":  []string{e.pod.IP.String()},
				"conditions": map[string]any{"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
				"nodeName":   e.pod.Node.Name,
				"targetRef":  map[string]any{"kind": "Pod", "name": e.pod.Name, "namespace": "default"},
			}
			switch e.nodeName {
			case "":
			case "-":
				delete(m, "nodeName")
			default:
				m["nodeName"] = e.nodeName
			}
			eps = append(eps, m)
		}
		objs = append(objs, map[string]any{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
			"metadata": map[string]any{"name": d.name + "-abcde", "namespace": "default",
				"labels": map[string]any{"kubernetes.io/service-name": d.name}},
			"ports":     epPorts,
			"endpoints": eps,
		})
	}
	b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": objs})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (c *svcCluster) apply(d svcDef) {
	c.t.Helper()
	if err := c.lab.WriteState("svc-"+d.name+".yaml", d.yaml(c.t)); err != nil {
		c.t.Fatal(err)
	}
}

func svcTCPPort(port int) []svcPort {
	return []svcPort{{name: "tcp", proto: "TCP", port: port, target: 9090}}
}

func TestServices(t *testing.T) {
	for _, mode := range svcModes {
		t.Run(mode, func(t *testing.T) { testServices(t, mode) })
	}
}

func testServices(t *testing.T, mode string) {
	c := svcStart(t, mode)
	l := c.lab
	n1, n2, n3 := l.Node("node1"), l.Node("node2"), l.Node("node3")

	t.Run("basic endpoint from every kind of client, source IP kept", func(t *testing.T) {
		c.apply(svcDef{name: "basic", clusterIP: "10.96.1.10", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}})
		for _, client := range []*lab.Pod{c.c1, c.c3, c.c4} {
			c.eventuallyServes(t, client.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
			out, err := c.probeIn(client.NSPath(), "tcp", "10.96.1.10:80", 2*time.Second)
			if _, src := svcAnswer(out); err != nil || src != client.IP {
				t.Errorf("from %s: %q, %v; want the endpoint to see the pod's own address %s", client.Name, out, err, client.IP)
			}
		}
		// From a node's own network.
		c.eventuallyServes(t, n3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
		// The choice is random and even: both get a fair share of 60.
		seen := c.servers(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", 60)
		if seen["web1"] < 12 || seen["web2"] < 12 {
			t.Errorf("60 connections went %v; want both endpoints used evenly", seen)
		}
	})

	t.Run("multiport", func(t *testing.T) {
		c.apply(svcDef{name: "multi", clusterIP: "10.96.1.11", ports: []svcPort{
			{name: "http", proto: "TCP", port: 80, target: 8080},
			{name: "raw", proto: "TCP", port: 81, target: 9090},
		}, endpoints: []svcEndpoint{svcReady(c.web1)}})
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.11:81", "web1")
		out, err := c.c3.Probe(t.Context(), "http", "10.96.1.11:80")
		if name, _ := svcAnswer(out); err != nil || name != "web1" {
			t.Errorf("HTTP port of a multi-port Service: %q, %v", out, err)
		}
	})

	t.Run("same port number on TCP and UDP are two services", func(t *testing.T) {
		c.apply(svcDef{name: "dns", clusterIP: "10.96.1.12", ports: []svcPort{
			{name: "dns-tcp", proto: "TCP", port: 53, target: 5353},
			{name: "dns-udp", proto: "UDP", port: 53, target: 5353},
		}, endpoints: []svcEndpoint{svcReady(c.web1)}})
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.12:53", "web1")
		c.eventuallyServes(t, c.c3.NSPath(), "udp", "10.96.1.12:53", "web1")
		// The UDP port alone goes to web2 once its slice port says so.
		d := svcDef{name: "dns2", clusterIP: "10.96.1.22", ports: []svcPort{
			{name: "dns-tcp", proto: "TCP", port: 53, target: 5353},
			{name: "dns-udp", proto: "UDP", port: 53, target: 5353},
		}, noSlice: true}
		c.apply(d)
		split := fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: dns2-tcp, namespace: default, labels: {kubernetes.io/service-name: dns2}}
ports: [{name: dns-tcp, protocol: TCP, port: 5353}]
endpoints: [{addresses: [%s], conditions: {ready: true}, nodeName: node1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: dns2-udp, namespace: default, labels: {kubernetes.io/service-name: dns2}}
ports: [{name: dns-udp, protocol: UDP, port: 5353}]
endpoints: [{addresses: [%s], conditions: {ready: true}, nodeName: node2}]
`, c.web1.IP, c.web2.IP)
		if err := l.WriteState("svc-dns2-slices.yaml", split); err != nil {
			t.Fatal(err)
		}
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.22:53", "web1")
		c.eventuallyServes(t, c.c3.NSPath(), "udp", "10.96.1.22:53", "web2")
	})

	t.Run("no endpoints: connection refused within one second", func(t *testing.T) {
		c.apply(svcDef{name: "empty", clusterIP: "10.96.1.13", ports: svcTCPPort(80), noSlice: true})
		// Until the rules are in, connections fail otherwise; a full sync
		// (every 2 s here) also puts the proxy's filter jumps back on top
		// if the node agent inserted its own above them.
		var lastErr error
		deadline := time.Now().Add(svcTimeout)
		for {
			start := time.Now()
			_, lastErr = c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.13:80", 3*time.Second)

			if errors.Is(lastErr, syscall.ECONNREFUSED) && time.Since(start) < time.Second {
				break
			}
			if time.Now().After(deadline) {
				out, _ := n3.Exec(t.Context(), "iptables-save", "-t", "filter")
				t.Fatalf("no endpoints: last probe: %v; want connection refused within 1s; node3 filter table:\n%s", lastErr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, from := range []string{c.c1.NSPath(), c.c4.NSPath(), n3.NSPath()} {
			start := time.Now()
			_, err := c.probeIn(from, "tcp", "10.96.1.13:80", 3*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Errorf("from %s: %v after %v; want connection refused within 1s", from, err, time.Since(start))
			}
		}
	})

	t.Run("hairpin: a pod reaches itself through its Service", func(t *testing.T) {
		c.apply(svcDef{name: "hairpin", clusterIP: "10.96.1.14", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web1)}})
		c.eventuallyServes(t, c.web1.NSPath(), "tcp", "10.96.1.14:80", "web1")
		out, _ := c.probeIn(c.web1.NSPath(), "tcp", "10.96.1.14:80", 2*time.Second)
		_, src := svcAnswer(out)
		switch {
		case !src.IsValid():
			t.Errorf("hairpin answer %q", out)
		case c.mode != "ebpf" && src == c.web1.IP:
			// DNAT on the bridge: without masquerade the reply would skip
			// the node and never be un-DNATed.
			t.Errorf("hairpin answer %q: the pod saw its own address, want it masqueraded", out)
		case c.mode == "ebpf" && src != c.web1.IP:
			// Socket LB connects the pod to itself directly: no packet
			// ever carries the VIP, nothing needs masquerading.
			t.Errorf("hairpin answer %q: want the pod's own address %s (a direct connection)", out, c.web1.IP)
		}
	})

	// Hand-written and third-party slices omit nodeName or get it wrong;
	// locality then comes from the node's podCIDR. The pod is named by no
	// other Service, whose hairpin rule would hide the bug.
	t.Run("hairpin: a slice without nodeName or with a wrong one, TCP and UDP", func(t *testing.T) {
		self, err := n3.AddPod(t.Context(), "self3")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := self.StartEcho(lab.EchoOptions{TCP: []string{":" + svcTCP}, UDP: []string{":" + svcUDP}}); err != nil {
			t.Fatal(err)
		}
		ports := []svcPort{{name: "tcp", proto: "TCP", port: 80, target: 9090}, {name: "udp", proto: "UDP", port: 53, target: 5353}}
		for _, nodeName := range []string{"-", "node1"} {
			c.apply(svcDef{name: "hairpin-nonode", clusterIP: "10.96.1.26", ports: ports,
				endpoints: []svcEndpoint{{pod: self, ready: true, serving: true, nodeName: nodeName}}})
			for _, pa := range [][2]string{{"tcp", "10.96.1.26:80"}, {"udp", "10.96.1.26:53"}} {
				c.eventuallyServes(t, self.NSPath(), pa[0], pa[1], "self3")
				out, err := c.probeIn(self.NSPath(), pa[0], pa[1], 2*time.Second)
				_, src := svcAnswer(out)
				// In ebpf mode the pod connects to itself directly (see
				// the hairpin test above): its own address is right; the
				// netfilter modes masquerade.
				if err != nil || !src.IsValid() || (src == self.IP) != (c.mode == "ebpf") {
					t.Errorf("nodeName %q, %s hairpin: %q, %v; want an answer, masqueraded in iptables mode, from the pod itself in ebpf mode", nodeName, pa[0], out, err)
				}
			}
		}
	})

	t.Run("NodePort from outside, other nodes and pods", func(t *testing.T) {
		c.apply(svcDef{name: "np", clusterIP: "10.96.1.15", typ: "NodePort",
			ports:     []svcPort{{name: "tcp", proto: "TCP", port: 80, target: 9090, nodePort: 30080}},
			endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}})
		for _, n := range []*lab.Node{n1, n3, l.Node("node4")} {
			addr := net.JoinHostPort(n.IP.String(), "30080")
			c.eventuallyServes(t, l.OutsideHost.NSPath(), "tcp", addr, "web1", "web2")
			out, _ := c.probeIn(l.OutsideHost.NSPath(), "tcp", addr, 2*time.Second)
			if _, src := svcAnswer(out); src == l.OutsideIP {
				t.Errorf("NodePort with policy Cluster via %s: endpoint saw the client %s; want it masqueraded", n.Name, src)
			}
		}
		c.eventuallyServes(t, c.c4.NSPath(), "tcp", net.JoinHostPort(n2.IP.String(), "30080"), "web1", "web2")
	})

	// A NodePort answers on every node address, node1's bridge address
	// among them, which other nodes route to over their pod routes: from
	// node4 over VXLAN. Its endpoint on node4 gets the flow SNATed to that
	// address, so its replies go back over VXLAN too, arriving at node1
	// decapsulated on the VXLAN device, past the uplink's program.
	t.Run("NodePort at a node's bridge address, request and replies over VXLAN", func(t *testing.T) {
		web4, err := l.Node("node4").AddPod(t.Context(), "web4")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := web4.StartEcho(lab.EchoOptions{TCP: []string{":" + svcTCP}}); err != nil {
			t.Fatal(err)
		}
		c.apply(svcDef{name: "np-vxlan", clusterIP: "10.96.1.27", typ: "NodePort",
			ports:     []svcPort{{name: "tcp", proto: "TCP", port: 80, target: 9090, nodePort: 30087}},
			endpoints: []svcEndpoint{svcReady(web4)}})
		addr := net.JoinHostPort(n1.PodCIDR.Addr().Next().String(), "30087")
		// From node3 (host-gw to node1): the replies come back over VXLAN.
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", addr, "web4")
		// From node4: both ways over VXLAN.
		c.eventuallyServes(t, c.c4.NSPath(), "tcp", addr, "web4")
	})

	t.Run("externalIPs and load-balancer IPs with source ranges", func(t *testing.T) {
		if err := l.WriteState("svc-lb.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.25
  clusterIPs: [10.96.1.25]
  externalIPs: [192.0.2.50]
  loadBalancerSourceRanges: [%s]
  ports: [{name: tcp, protocol: TCP, port: 80, targetPort: 9090, nodePort: 30085}]
status: {loadBalancer: {ingress: [{ip: 192.0.2.60}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: lb-x, namespace: default, labels: {kubernetes.io/service-name: lb}}
ports: [{name: tcp, protocol: TCP, port: 9090}]
endpoints: [{addresses: [%s], conditions: {ready: true}, nodeName: node1}]
`, netip.PrefixFrom(c.c3.IP, 32), c.web1.IP)); err != nil {
			t.Fatal(err)
		}
		// Traffic to these addresses that reaches a node is DNATed there.
		c.eventuallyServes(t, c.c4.NSPath(), "tcp", "192.0.2.50:80", "web1")
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "192.0.2.60:80", "web1")
		if out, err := c.probeIn(c.c4.NSPath(), "tcp", "192.0.2.60:80", time.Second); err == nil {
			t.Errorf("load-balancer IP answered %q to a client outside loadBalancerSourceRanges", out)
		}
	})

	t.Run("session affinity, off and on again", func(t *testing.T) {
		d := svcDef{name: "sticky", clusterIP: "10.96.1.16", ports: svcTCPPort(80), affinity: 600,
			endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}}
		c.apply(d)
		sticky := func() {
			t.Helper()
			waitUntil(t, svcTimeout, func() bool {
				seen := make(map[string]bool)
				for range 15 {
					out, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.16:80", time.Second)
					if err != nil {
						return false
					}
					name, _ := svcAnswer(out)
					seen[name] = true
				}
				return len(seen) == 1
			}, "15 connections from one client to reach one endpoint")
		}
		sticky()
		d.affinity = 0
		c.apply(d)
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.16:80", "web1", "web2")
		d.affinity = 600
		c.apply(d)
		sticky()
	})

	t.Run("externalTrafficPolicy Local and its health check port", func(t *testing.T) {
		c.apply(svcDef{name: "local", clusterIP: "10.96.1.17", typ: "NodePort", etpLocal: true, healthCheckNodePort: 32081,
			ports:     []svcPort{{name: "tcp", proto: "TCP", port: 80, target: 9090, nodePort: 30081}},
			endpoints: []svcEndpoint{svcReady(c.web2)}})
		addr := net.JoinHostPort(n2.IP.String(), "30081")
		c.eventuallyServes(t, l.OutsideHost.NSPath(), "tcp", addr, "web2")
		out, _ := c.probeIn(l.OutsideHost.NSPath(), "tcp", addr, 2*time.Second)
		if _, src := svcAnswer(out); src != l.OutsideIP {
			t.Errorf("externalTrafficPolicy Local: endpoint saw %s, want the client's own %s", src, l.OutsideIP)
		}
		if out, err := c.probeIn(l.OutsideHost.NSPath(), "tcp", net.JoinHostPort(n1.IP.String(), "30081"), time.Second); err == nil {
			t.Errorf("node1 has no local endpoint but its NodePort answered %q", out)
		}
		hc := func(n *lab.Node) (int, string) {
			code, body, err := svcHTTPGet(l.OutsideHost.NSPath(), net.JoinHostPort(n.IP.String(), "32081"))
			if err != nil {
				return 0, err.Error()
			}
			return code, body
		}
		waitUntil(t, svcTimeout, func() bool { code, _ := hc(n2); return code == 200 }, "health check 200 on node2")
		if code, body := hc(n2); !strings.Contains(body, `"localEndpoints":1`) {
			t.Errorf("node2 health check: %d %s; want the local endpoint count 1", code, body)
		}
		// node1's proxyd syncs on its own: wait for its answer, then
		// check it is the no-local-endpoint one.
		waitUntil(t, svcTimeout, func() bool { code, _ := hc(n1); return code != 0 }, "node1's health check port served")
		if code, body := hc(n1); code != 503 {
			t.Errorf("node1 health check: %d %s; want 503", code, body)
		}
		// Pods may still use every endpoint.
		c.eventuallyServes(t, c.c1.NSPath(), "tcp", net.JoinHostPort(n1.IP.String(), "30081"), "web2")
	})

	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		c.apply(svcDef{name: "itp", clusterIP: "10.96.1.18", ports: svcTCPPort(80), itpLocal: true,
			endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}})
		c.eventuallyServes(t, c.c1.NSPath(), "tcp", "10.96.1.18:80", "web1")
		if out, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.18:80", time.Second); err == nil {
			t.Errorf("node3 has no local endpoint but the Service answered %q", out)
		}
	})

	t.Run("trafficDistribution PreferSameNode", func(t *testing.T) {
		if err := l.WriteState("svc-close.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: close, namespace: default}
spec: {clusterIP: 10.96.1.24, clusterIPs: [10.96.1.24], trafficDistribution: PreferSameNode, ports: [{name: tcp, protocol: TCP, port: 80, targetPort: 9090}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: close-x, namespace: default, labels: {kubernetes.io/service-name: close}}
ports: [{name: tcp, protocol: TCP, port: 9090}]
endpoints:
- {addresses: [%s], conditions: {ready: true}, nodeName: node1, zone: %s}
- {addresses: [%s], conditions: {ready: true}, nodeName: node2, zone: %s}
`, c.web1.IP, n1.Zone, c.web2.IP, n2.Zone)); err != nil {
			t.Fatal(err)
		}
		// A client next to an endpoint uses it; one on a node without
		// any uses all of them (or those of its zone).
		c.eventuallyServes(t, c.c1.NSPath(), "tcp", "10.96.1.24:80", "web1")
		if n3.Zone == n1.Zone && n3.Zone == n2.Zone {
			c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.24:80", "web1", "web2")
		}
	})

	t.Run("terminating endpoints are used only when none is ready", func(t *testing.T) {
		term := svcEndpoint{pod: c.web1, serving: true, terminating: true}
		gone := svcEndpoint{pod: c.web2, serving: false, terminating: true}
		d := svcDef{name: "term", clusterIP: "10.96.1.19", ports: svcTCPPort(80), endpoints: []svcEndpoint{term, gone}}
		c.apply(d)
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.19:80", "web1")
		d.endpoints = []svcEndpoint{term, svcReady(c.web2)}
		c.apply(d)
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.19:80", "web2")
	})

	t.Run("UDP endpoint replaced while the client keeps sending", func(t *testing.T) {
		d := svcDef{name: "udp", clusterIP: "10.96.1.20", ports: []svcPort{{name: "dns", proto: "UDP", port: 53, target: 5353}},
			endpoints: []svcEndpoint{svcReady(c.web1)}}
		c.apply(d)
		c.eventuallyServes(t, c.c3.NSPath(), "udp", "10.96.1.20:53", "web1")
		// One socket, one source port: the conntrack entry would pin it to
		// web1 if nobody deleted it.
		ask := c.udpClient(t, c.c3.NSPath(), "10.96.1.20:53")
		waitUntil(t, svcTimeout, func() bool { return ask() == "web1" }, "UDP answers from web1")
		d.endpoints = []svcEndpoint{svcReady(c.web2)}
		c.apply(d)
		changed := time.Now()
		var got string
		for time.Since(changed) < 5*time.Second {
			if got = ask(); got == "web2" {
				break
			}
		}
		if took := time.Since(changed); got != "web2" || took > 2*time.Second {
			t.Errorf("UDP client reached %q %v after the endpoint changed; want web2 within 2s", got, took.Round(time.Millisecond))
		}
	})

	t.Run("UDP client sending before the Service existed is not blackholed", func(t *testing.T) {
		// Packets to a VIP nobody programs yet are routed out and leave a
		// conntrack entry without DNAT; once the Service appears that entry
		// must go, or the client keeps missing it.
		ask := c.udpClient(t, c.c3.NSPath(), "10.96.1.30:53")
		for range 5 {
			if got := ask(); got != "" {
				t.Fatalf("answer %q before the Service exists", got)
			}
		}
		c.apply(svcDef{name: "late", clusterIP: "10.96.1.30", ports: []svcPort{{name: "dns", proto: "UDP", port: 53, target: 5353}},
			endpoints: []svcEndpoint{svcReady(c.web1)}})
		start := time.Now()
		var got string
		for time.Since(start) < 5*time.Second && got == "" {
			got = ask()
		}
		if took := time.Since(start); got != "web1" || took > 2*time.Second {
			t.Errorf("client reached %q %v after the Service appeared; want web1 within 2s", got, took.Round(time.Millisecond))
		}
	})

	t.Run("TCP connections tried before the Service existed leave no stale entry", func(t *testing.T) {
		// SYNs to a VIP nobody programs yet are routed out and leave
		// un-NATed SYN_SENT entries (120 s); a later connection from the
		// same source port would match one and go nowhere, unless proxyd
		// deletes them when the Service's rules appear.
		// The source ports lie below the ephemeral range (32768-60999), so
		// no other connection of the client's namespace, live or in
		// TIME_WAIT, can hold one when the test binds it.
		const vip, first, ports = "10.96.1.31:80", 21000, 20
		dial := func(port int, timeout time.Duration) error {
			return c.inClient(c.c3.NSPath(), func() error {
				d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}, Timeout: timeout}
				conn, err := d.Dial("tcp", vip)
				if err != nil {
					return err
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(timeout))
				_, err = io.ReadAll(io.LimitReader(conn, 1))
				return err
			})
		}
		for p := first; p < first+ports; p++ {
			if err := dial(p, 100*time.Millisecond); err == nil {
				t.Fatalf("port %d: connected before the Service exists", p)
			}
		}
		c.apply(svcDef{name: "late-tcp", clusterIP: "10.96.1.31", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web1)}})
		c.eventuallyServes(t, c.c1.NSPath(), "tcp", vip, "web1")
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", vip, "web1")
		time.Sleep(300 * time.Millisecond) // the cleanup follows the sync that served
		var failed []string
		for p := first; p < first+ports; p++ {
			if err := dial(p, 2*time.Second); err != nil {
				failed = append(failed, fmt.Sprintf("%d: %v", p, err))
			}
		}
		if len(failed) > 0 {
			t.Errorf("%d of %d connections from source ports used before the Service existed failed: %v", len(failed), ports, failed)
		}
	})

	t.Run("proxyd restart under steady load loses no request", func(t *testing.T) {
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
		var ok, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.10:80", 2*time.Second); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					ok.Add(1)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		time.Sleep(300 * time.Millisecond)
		for _, n := range []*lab.Node{n3, n1} {
			if err := c.proxyd[n.Name].Stop(); err != nil {
				t.Errorf("proxyd on %s: %v", n.Name, err)
			}
			time.Sleep(200 * time.Millisecond)
			c.startProxyd(n)
			time.Sleep(700 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		if failed.Load() != 0 || ok.Load() < 50 {
			t.Errorf("during restarts: %d requests ok, %d failed (first: %v)", ok.Load(), failed.Load(), firstErr.Load())
		}
		t.Logf("%d requests during two proxyd restarts, none failed", ok.Load())
	})

	// A proxyd restarted while a state file is broken must not take the
	// rest for the whole cluster and drop that file's Services.
	t.Run("proxyd restarted while a Service's state file is broken keeps serving it", func(t *testing.T) {
		basic := svcDef{name: "basic", clusterIP: "10.96.1.10", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}}
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
		if err := l.WriteState("svc-basic.yaml", basic.yaml(t)+"  broken: [\n"); err != nil {
			t.Fatal(err)
		}
		defer c.apply(basic)
		if err := c.proxyd[n3.Name].Stop(); err != nil {
			t.Errorf("proxyd on node3: %v", err)
		}
		c.startProxyd(n3)
		// Several of its sync periods (2 s): nothing is programmed, so
		// nothing is removed.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if out, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.10:80", 2*time.Second); err != nil {
				t.Fatalf("Service of the broken file after proxyd's restart: %q, %v", out, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// /healthz stays 200, as kube-proxy's while it starts (a load
		// balancer or the liveness probe failing it would only add an
		// outage); proxyd status names the file.
		if ok, body := healthz(n3); !ok || !strings.Contains(body, "svc-basic.yaml") {
			t.Errorf("/healthz with the state half read: %q; want 200 naming the file", body)
		}
		if st := proxydHealth(t, l, n3); !strings.Contains(st.Components["cluster-state"], "svc-basic.yaml") {
			t.Errorf("proxyd status with the state half read: %v; want the cluster state naming the file", st.Components)
		}
		c.apply(basic)
		waitUntil(t, 10*time.Second, func() bool { return proxydHealth(t, l, n3).Components["cluster-state"] == "ok" }, "cluster state loaded once the file is fixed")
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
	})

	t.Run("a full resync repairs rules someone else deleted", func(t *testing.T) {
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
		if c.mode == "ebpf" {
			svcDeleteFrontend(t, n3, netip.MustParseAddrPort("10.96.1.10:80"))
		} else if c.mode == "nftables" {
			svcFlushNFTChain(t, n3, "services-ip4")
		} else if out, err := n3.Exec(t.Context(), "iptables", "-t", "nat", "-F", "PODSVC-SERVICES"); err != nil {
			t.Fatalf("flush: %v: %s", err, out)
		}
		if out, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.10:80", time.Second); err == nil {
			t.Fatalf("Service still answered (%q) right after its rules were flushed", out)
		}
		// --sync-period is 2 s here.
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.10:80", "web1", "web2")
	})

	t.Run("Services of another proxy and headless Services are left alone", func(t *testing.T) {
		other := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: other, namespace: default, labels: {service.kubernetes.io/service-proxy-name: someone-else}}
spec: {clusterIP: 10.96.1.21, clusterIPs: [10.96.1.21], ports: [{name: tcp, protocol: TCP, port: 80, targetPort: 9090}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: other-x, namespace: default, labels: {kubernetes.io/service-name: other}}
ports: [{name: tcp, protocol: TCP, port: 9090}]
endpoints: [{addresses: [%s], conditions: {ready: true}}]
`, c.web1.IP)
		if err := l.WriteState("svc-other.yaml", other); err != nil {
			t.Fatal(err)
		}
		// A Service written after it is programmed, so the state was read.
		c.apply(svcDef{name: "after-other", clusterIP: "10.96.1.23", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web2)}})
		c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.1.23:80", "web2")
		if out, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.1.21:80", time.Second); err == nil {
			t.Errorf("a Service of another proxy answered %q", out)
		}
	})

	if c.mode != "iptables" {
		t.Run(c.mode+" mode writes no Service rules into iptables", func(t *testing.T) {
			for _, n := range l.Nodes {
				out, err := n.Exec(t.Context(), "iptables-save")
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(out, "PODSVC") {
					t.Errorf("%s: Service rules in iptables:\n%s", n.Name, out)
				}
				// nftables mode keeps the node firewall in its table too.
				if c.mode == "nftables" && strings.Contains(out, "PODNET-") {
					t.Errorf("%s: node firewall rules in iptables in nftables mode:\n%s", n.Name, out)
				}
			}
		})
	}

	t.Run("metrics and healthz", func(t *testing.T) {
		code, body, err := svcHTTPGet(n3.NSPath(), "127.0.0.1:10249/metrics")
		if err != nil || code != 200 {
			t.Fatalf("metrics: %d %v", code, err)
		}
		fams := metricstest.Parse(t, body)
		for _, m := range [][]string{{"kubeproxy_sync_full_proxy_rules_duration_seconds"},
			{"kubeproxy_sync_proxy_rules_iptables_total", "table", map[string]string{"iptables": "nat", "ebpf": "services", "nftables": "nftables-chains"}[c.mode]}, {"podnet_proxy_service_ports"}, {"podnet_proxy_endpoints"},
			{"kubeproxy_sync_proxy_rules_last_timestamp_seconds"}, {"kubeproxy_sync_proxy_rules_service_changes_total"}} {
			if v, ok := metricstest.Value(fams, m[0], m[1:]...); !ok || v == 0 {
				t.Errorf("metrics: %v = %v (found %v), want above 0", m, v, ok)
			}
		}
		// Present though maybe zero: the restarts above leave this
		// proxyd's syncs so far full ones.
		for _, name := range []string{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "kubeproxy_sync_partial_proxy_rules_duration_seconds"} {
			if _, ok := metricstest.Value(fams, name); !ok {
				t.Errorf("metrics lack %s", name)
			}
		}
		if code, body, err := svcHTTPGet(n3.NSPath(), "127.0.0.1:10256/healthz"); err != nil || code != 200 {
			t.Errorf("healthz: %d %s %v", code, body, err)
		}
	})

	t.Run("proxyd status shows what is programmed", func(t *testing.T) {
		checkProxydStatus(t, l, n3, c.mode)
	})

	// --cleanup removes every rule and chain of the Service proxy.
	t.Run("cleanup", func(t *testing.T) {
		if err := c.proxyd["node4"].Stop(); err != nil {
			t.Fatal(err)
		}
		n4 := l.Node("node4")
		if out, err := n4.Exec(t.Context(), filepath.Join(l.BinDir, "proxyd"), "--cleanup", "--node-name", "node4", "--node-config", n4.NodeConfigPath(),
			"--bpf-pin-dir", n4.BPFPinDir()); err != nil {
			t.Fatalf("proxyd --cleanup: %v: %s", err, out)
		}
		if pins, err := ebpfmode.Pins(n4.BPFPinDir()); err != nil || len(pins) > 0 {
			t.Errorf("BPF pins left after --cleanup: %v %v", pins, err)
		}
		if out, _ := c.probeIn(c.c4.NSPath(), "tcp", "10.96.1.10:80", time.Second); out != "" {
			t.Errorf("a Service still answered on node4 after --cleanup: %q", out)
		}
		out, err := n4.Exec(t.Context(), "iptables-save")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "PODSVC") {
			t.Errorf("rules left after --cleanup:\n%s", out)
		}
		if tb := svcReadNFT(t, n4); len(tb.Chains)+len(tb.Sets) > 0 {
			t.Errorf("nftables objects left after --cleanup:\n%s", tb)
		}
	})
}

// svcModes are the Service proxy modes the Service suites run in.
var svcModes = []string{"iptables", "ebpf", "nftables"}

// svcFlushNFTChain flushes a chain of podnet's nftables table in a node,
// as someone else's mistake would.
func svcFlushNFTChain(t *testing.T, n *lab.Node, chain string) {
	t.Helper()
	if err := ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		return nftables.Netlink{}.Apply([]nftables.Op{{Kind: nftables.OpFlushChain, Chain: &nftables.Chain{Name: chain}}})
	}); err != nil {
		t.Fatalf("flush %s in %s: %v", chain, n.Name, err)
	}
}

// svcReadNFT reads the IPv4 objects of podnet's nftables table in a node.
func svcReadNFT(t *testing.T, n *lab.Node) *nftables.Table {
	t.Helper()
	var tb *nftables.Table
	if err := ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		var err error
		tb, err = nftables.Netlink{}.Read(ipfamily.IPv4)
		return err
	}); err != nil {
		t.Fatalf("read podnet's nftables table in %s: %v", n.Name, err)
	}
	return tb
}

// svcHTTPGet does a GET of addr+path ("ip:port/path") from inside the
// namespace at nsPath.
func svcHTTPGet(nsPath, target string) (int, string, error) {
	addr, path, _ := strings.Cut(target, "/")
	var conn net.Conn
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	}); err != nil {
		return 0, "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	data, err := io.ReadAll(conn)
	if err != nil {
		return 0, "", err
	}
	head, body, _ := strings.Cut(string(data), "\r\n\r\n")
	var code int
	fmt.Sscanf(head, "HTTP/1.%d %d", new(int), &code)
	return code, body, nil
}

// udpClient returns a func that sends a query to addr over UDP from the
// namespace at nsPath and names the echo server that answered ("" after
// 100 ms of silence). All queries come from one source port.
//
// In iptables mode one connected socket asks them all: the conntrack entry
// a stale endpoint would stay pinned by is what the tests check is
// deleted. In ebpf mode a connected socket is translated once, at
// connect, and stays with its endpoint; one pinned to a removed endpoint is
// destroyed, so its owner gets an error and must dial again (tested in
// dataplane/proxy/ebpf). So each query comes from a new socket on the same
// port, as resolvers and the Kubernetes conformance UDP tests do.
func (c *svcCluster) udpClient(t *testing.T, nsPath, addr string) (ask func() string) {
	t.Helper()
	dial := func(laddr *net.UDPAddr) net.Conn {
		t.Helper()
		var conn net.Conn
		if err := c.inClient(nsPath, func() error {
			var err error
			conn, err = (&net.Dialer{LocalAddr: laddr}).Dial("udp", addr)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	query := func(conn net.Conn) string {
		buf := make([]byte, 512)
		conn.Write([]byte("q\n"))
		conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			return ""
		}
		name, _ := svcAnswer(strings.TrimSpace(string(buf[:n])))
		return name
	}
	conn := dial(nil)
	if c.mode != "ebpf" {
		t.Cleanup(func() { conn.Close() })
		return func() string { return query(conn) }
	}
	laddr := conn.LocalAddr().(*net.UDPAddr)
	conn.Close()
	return func() string {
		conn := dial(laddr)
		defer conn.Close()
		return query(conn)
	}
}

// svcDeleteFrontend deletes the frontend entry of vip in node n's pinned
// services map, as someone else tampering with the maps would.
func svcDeleteFrontend(t *testing.T, n *lab.Node, vip netip.AddrPort) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFPinDir(), bpf.SockMapServicesV2), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p := vip.Port()
	k := bpf.SockSvcKey{Addr: netip.AddrFrom16(vip.Addr().As16()).As16(), Port: p<<8 | p>>8, Proto: 6}
	if err := m.Delete(&k); err != nil {
		t.Fatalf("delete the frontend of %s: %v", vip, err)
	}
}

// checkProxydStatus runs `proxyd status` on node n and compares what it
// says with the node's routes and its NAT rules (iptables mode) or its
// pinned maps (ebpf mode).
func checkProxydStatus(t *testing.T, l *lab.Lab, n *lab.Node, mode string) {
	t.Helper()
	ctx := t.Context()
	out, err := n.Exec(ctx, filepath.Join(l.BinDir, "proxyd"), "status", "-o", "json", "--bpf-pin-dir", n.BPFPinDir())
	if err != nil {
		t.Fatalf("proxyd status -o json: %v", err)
	}
	var st struct {
		Health       agent.HealthStatus `json:"health"`
		Node         agent.NodeStatus   `json:"node"`
		ServiceProxy proxy.Status       `json:"serviceProxy"`
		BPFMaps      *struct {
			ebpfmode.Programmed
			Error       string   `json:"error"`
			Differences []string `json:"differences"`
		} `json:"bpfMaps"`
		NFTTable *struct {
			nftables.Programmed
			Error       string   `json:"error"`
			Differences []string `json:"differences"`
		} `json:"nftTable"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("proxyd status -o json: %v\n%s", err, out)
	}
	if st.ServiceProxy.Mode != mode || !st.Health.Healthy || st.Node.PodCIDR != n.PodCIDR.String() || st.ServiceProxy.LastSync.IsZero() {
		t.Errorf("status: mode %q, healthy %v, podCIDR %q (want %v), last sync %v", st.ServiceProxy.Mode, st.Health.Healthy, st.Node.PodCIDR, n.PodCIDR, st.ServiceProxy.LastSync)
	}
	checkPeers(t, n, st.Node.Peers)
	if mode == "ebpf" {
		if st.BPFMaps == nil || st.BPFMaps.Error != "" {
			t.Fatalf("proxyd status in ebpf mode: maps %+v", st.BPFMaps)
		}
		checkStatusMaps(t, l, n, st.BPFMaps.Programmed, st.BPFMaps.Differences, len(st.ServiceProxy.Services))
		return
	}
	if mode == "nftables" {
		tb := st.NFTTable
		if tb == nil || tb.Error != "" || len(tb.Frontends) == 0 || len(tb.Differences)+len(tb.Problems) > 0 {
			t.Fatalf("proxyd status in nftables mode: table %+v", tb)
		}
		return
	}
	// Every endpoint the status names is a DNAT target in the rules, and
	// every DNAT target of the rules is in the status.
	nat, err := n.Exec(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	inRules := map[string]bool{}
	for _, f := range strings.Fields(nat) {
		if ap, err := netip.ParseAddrPort(f); err == nil {
			inRules[ap.String()] = true
		}
	}
	inStatus := map[string]bool{}
	services := 0
	for _, svc := range st.ServiceProxy.Services {
		for _, p := range svc.Ports {
			services++
			for _, e := range p.Endpoints {
				inStatus[e.Address] = true
				if !inRules[e.Address] {
					t.Errorf("status: %s/%s %s/%s → %s, which no rule DNATs to", svc.Namespace, svc.Name, p.Name, p.Protocol, e.Address)
				}
			}
			for _, f := range p.Frontends {
				host, port, _ := net.SplitHostPort(f)
				if host != "" && !strings.Contains(nat, "-d "+host+"/32") || !strings.Contains(nat, "--dport "+port) {
					t.Errorf("status: frontend %s of %s/%s, which no rule matches", f, svc.Namespace, svc.Name)
				}
			}
		}
	}
	for a := range inRules {
		if !inStatus[a] && strings.Contains(nat, "--to-destination "+a) {
			t.Errorf("the rules DNAT to %s, which the status does not list", a)
		}
	}
	if services == 0 {
		t.Error("status lists no Service ports")
	}
	text, err := n.Exec(ctx, filepath.Join(l.BinDir, "proxyd"), "status")
	if err != nil {
		t.Fatalf("proxyd status: %v", err)
	}
	for _, want := range []string{"Mode:", "iptables", "Peers (", "Services (", st.ServiceProxy.Services[0].Name} {
		if !strings.Contains(text, want) {
			t.Errorf("proxyd status lacks %q:\n%s", want, text)
		}
	}
	t.Logf("proxyd status on %s:\n%s", n.Name, text)
}

// checkStatusMaps compares the maps `proxyd status` shows with node n's
// pinned maps, read here entry by entry: the same frontends with the same
// backends in the same slots, and nothing that disagrees with the Services
// the daemon reports.
func checkStatusMaps(t *testing.T, l *lab.Lab, n *lab.Node, shown ebpfmode.Programmed, differences []string, services int) {
	t.Helper()
	var got []string
	for _, f := range shown.Frontends {
		got = append(got, fmt.Sprintf("%s/%s %s -> %s", f.Address, f.Protocol, f.Scope, strings.Join(f.Backends, " ")))
	}
	slices.Sort(got)
	want := pinnedFrontends(t, n.BPFPinDir())
	if !slices.Equal(got, want) {
		t.Errorf("proxyd status shows the maps as\n%s\nthe pinned maps hold\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(shown.Problems)+len(differences) > 0 || services == 0 || len(want) < services {
		t.Errorf("proxyd status: %d Services, %d frontends in the maps; problems %v; differences %v", services, len(want), shown.Problems, differences)
	}
	text, err := n.Exec(t.Context(), filepath.Join(l.BinDir, "proxyd"), "status", "--bpf-pin-dir", n.BPFPinDir())
	if err != nil {
		t.Fatalf("proxyd status: %v", err)
	}
	if !strings.Contains(text, "BPF maps ("+n.BPFPinDir()+")") || !strings.Contains(text, "default/basic:tcp") {
		t.Errorf("proxyd status lacks the maps' section:\n%s", text)
	}
	t.Logf("proxyd status on %s:\n%s", n.Name, text)
}

// pinnedFrontends reads the services and backends maps pinned in pinDir:
// one line per frontend, "address/protocol scope -> backends in slot
// order", sorted.
func pinnedFrontends(t *testing.T, pinDir string) []string {
	t.Helper()
	load := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	svcs, bes := load(bpf.SockMapServicesV2), load(bpf.SockMapBackendsV2)
	entries := map[bpf.SockSvcKey]bpf.SockSvcVal{}
	var k bpf.SockSvcKey
	var v bpf.SockSvcVal
	for it := svcs.Iterate(); it.Next(&k, &v); {
		entries[k] = v
	}
	swap := func(p uint16) uint16 { return p<<8 | p>>8 }
	var out []string
	for k, v := range entries {
		if k.Slot != 0 {
			continue
		}
		addr := "" // a NodePort's wildcard: :: or, for IPv4, ::ffff:0.0.0.0
		if a := netip.AddrFrom16(k.Addr).Unmap(); !a.IsUnspecified() {
			addr = a.String()
		}
		var backends []string
		for i := uint16(1); i <= v.Count; i++ {
			sk := k
			sk.Slot = i
			var b bpf.SockBackend
			if err := bes.Lookup(entries[sk].Id, &b); err != nil {
				t.Fatalf("frontend %s:%d slot %d: %v", addr, swap(k.Port), i, err)
			}
			backends = append(backends, netip.AddrPortFrom(netip.AddrFrom16(b.Addr).Unmap(), swap(b.Port)).String())
		}
		scope := map[uint8]string{0: "socket", 1: "external"}[k.Scope]
		proto := map[uint8]string{6: "TCP", 17: "UDP", 132: "SCTP"}[k.Proto]
		out = append(out, fmt.Sprintf("%s:%d/%s %s -> %s", addr, swap(k.Port), proto, scope, strings.Join(backends, " ")))
	}
	slices.Sort(out)
	return out
}

// checkPeers compares the peers of `proxyd status` with the node's routes.
func checkPeers(t *testing.T, n *lab.Node, peers []nodenet.PeerStatus) {
	t.Helper()
	for _, p := range peers {
		route, _ := n.Exec(t.Context(), "ip", "route", "show", p.PodCIDR)
		_, via, _ := strings.Cut(p.Route, " via ")
		gw, _, _ := strings.Cut(via, " ")
		if gw == "" || !strings.Contains(route, "via "+gw) {
			t.Errorf("status: peer %s route %q; the kernel has %q", p.Name, p.Route, route)
		}
	}
	if len(peers) == 0 {
		t.Error("status lists no peers")
	}
}

// proxydHealth is the health part of `proxyd status -o json` on node n.
func proxydHealth(t *testing.T, l *lab.Lab, n *lab.Node) agent.HealthStatus {
	t.Helper()
	out, err := n.Exec(t.Context(), filepath.Join(l.BinDir, "proxyd"), "status", "-o", "json")
	if err != nil {
		t.Fatalf("proxyd status -o json: %v", err)
	}
	var st struct {
		Health agent.HealthStatus `json:"health"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("proxyd status -o json: %v\n%s", err, out)
	}
	return st.Health
}
