package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/nodenet"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/ebpf"
)

// proxyd status in ebpf mode joins the maps' frontends to the Service ports
// of the daemon's report, and says where the two disagree.
func TestStatusBPFMaps(t *testing.T) {
	both := []string{"10.244.1.5:8080", "10.244.2.5:8080"}
	p := &ebpf.Programmed{PinDir: "/pins", Backends: 4, NodeAddrs: []string{"192.168.10.11", "fd00:10::11"}, SNAT: []string{"192.168.10.11", "fd00:10::11"}, Frontends: []ebpf.ProgrammedFrontend{
		{Address: "10.96.0.20:80", Protocol: "TCP", Scope: "socket", Backends: both},
		{Address: "10.96.9.9:80", Protocol: "TCP", Scope: "socket", Backends: []string{"10.244.3.3:80"}},
		{Address: ":30080", Protocol: "TCP", Scope: "external", Flags: []string{"local"}, Backends: both[:1], Maglev: 1},
		{Address: ":30080", Protocol: "TCP", Scope: "socket", Backends: both},
	}}
	services := []proxy.ServiceStatus{
		{Namespace: "default", Name: "gone", Ports: []proxy.PortStatus{{Protocol: "TCP", Frontends: []string{"10.96.0.30:80"},
			Endpoints: []proxy.EndpointStatus{{Address: "10.244.4.4:80", Cluster: true}}}}},
		{Namespace: "default", Name: "web", Ports: []proxy.PortStatus{{Name: "http", Protocol: "TCP", Frontends: []string{"10.96.0.20:80", ":30080"},
			Endpoints: []proxy.EndpointStatus{{Address: both[0], Cluster: true, Local: true}, {Address: both[1], Cluster: true}}}}},
	}
	m := compareBPFMaps(p, services)
	wantDiff := []string{
		"default/gone TCP: frontend 10.96.0.30:80 is not in the maps",
		"default/gone TCP: endpoints [10.244.4.4:80], in the maps []",
		"frontend 10.96.9.9:80/TCP (socket) is in the maps but of no Service proxyd reports",
	}
	if !slices.Equal(m.Differences, wantDiff) {
		t.Errorf("differences:\n%s\nwant:\n%s", strings.Join(m.Differences, "\n"), strings.Join(wantDiff, "\n"))
	}
	wantOwners := [][]string{{"default/web:http"}, nil, {"default/web:http"}, {"default/web:http"}}
	if !slices.EqualFunc(m.Owners, wantOwners, slices.Equal) {
		t.Errorf("owners %v, want %v", m.Owners, wantOwners)
	}

	var out bytes.Buffer
	printStatus(&out, statusReport{ServiceProxy: proxy.Status{Mode: "ebpf", Services: services}, BPFMaps: m}, time.Now())
	text := out.String()
	for _, line := range [][]string{
		{"BPF", "maps", "(/pins):", "4", "frontends,", "4", "backends;", "NodePorts", "on", "192.168.10.11", "fd00:10::11;", "SNAT", "to", "192.168.10.11", "fd00:10::11"},
		{"default/web:http", "10.96.0.20:80/TCP", "socket", "10.244.1.5:8080", "10.244.2.5:8080"},
		{"default/web:http", ":30080/TCP", "external", "local", "maglev/1", "10.244.1.5:8080"},
		{"-", "10.96.9.9:80/TCP", "socket", "10.244.3.3:80"},
		{"default/gone", "TCP:", "frontend", "10.96.0.30:80", "is", "not", "in", "the", "maps"},
	} {
		if !hasLine(text, line) {
			t.Errorf("proxyd status lacks the line %q:\n%s", strings.Join(line, " "), text)
		}
	}
}

// hasLine says whether text has a line of exactly these fields.
func hasLine(text string, fields []string) bool {
	for _, l := range strings.Split(text, "\n") {
		if slices.Equal(strings.Fields(l), fields) {
			return true
		}
	}
	return false
}

// proxyd status names the device that keeps the node network from
// syncing (another network's VXLAN device holding podnet's VNI and port),
// in the health of the node network and as the last route error.
func TestStatusNamesTheVXLANConflict(t *testing.T) {
	why := "routes: create podnet.1: the VXLAN VNI and port are taken: flannel.1 already holds VNI 1 on UDP port 8472 (another network's device, such as flannel's flannel.1): remove it, or move podnet's with --vxlan-vni or --vxlan-port: file exists"
	r := statusReport{
		Health: agent.HealthStatus{Healthy: true, Components: map[string]string{"node-network": why, "cluster-state": "ok"}},
		Node:   agent.NodeStatus{Status: nodenet.Status{Name: "node1", LastError: why}},
	}
	var out bytes.Buffer
	printStatus(&out, r, time.Now())
	for _, want := range []string{"node-network: " + why, "last route error: " + why} {
		if !hasLine(out.String(), strings.Fields(want)) {
			t.Errorf("proxyd status lacks %q:\n%s", want, out.String())
		}
	}
}

// A dual-stack Service's two ports each hold the NodePort in their family:
// proxyd status joins each map frontend ":port" to the port of its family
// only, so neither reports the other's endpoints.
func TestStatusBPFMapsDualStackNodePort(t *testing.T) {
	v4, v6 := "10.244.1.5:8080", "[fd00:244:1::5]:8080"
	p := &ebpf.Programmed{PinDir: "/pins", Frontends: []ebpf.ProgrammedFrontend{
		{Address: "10.96.0.20:80", Family: "IPv4", Protocol: "TCP", Scope: "socket", Backends: []string{v4}},
		{Address: ":30080", Family: "IPv4", Protocol: "TCP", Scope: "socket", Backends: []string{v4}},
		{Address: "[fd00:96::20]:80", Family: "IPv6", Protocol: "TCP", Scope: "socket", Backends: []string{v6}},
		{Address: ":30080", Family: "IPv6", Protocol: "TCP", Scope: "socket", Backends: []string{v6}},
	}}
	port := func(cip, ep string) proxy.PortStatus {
		return proxy.PortStatus{Name: "http", Protocol: "TCP", Frontends: []string{cip, ":30080"},
			Endpoints: []proxy.EndpointStatus{{Address: ep, Cluster: true}}}
	}
	services := []proxy.ServiceStatus{{Namespace: "default", Name: "web", Ports: []proxy.PortStatus{
		port("10.96.0.20:80", v4), port("[fd00:96::20]:80", v6)}}}
	m := compareBPFMaps(p, services)
	if len(m.Differences) > 0 {
		t.Errorf("differences: %v", m.Differences)
	}
	want := [][]string{{"default/web:http"}, {"default/web:http"}, {"default/web:http"}, {"default/web:http"}}
	if !slices.EqualFunc(m.Owners, want, slices.Equal) {
		t.Errorf("owners %v, want one port each", m.Owners)
	}
}
