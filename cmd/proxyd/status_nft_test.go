package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
)

// proxyd status in nftables mode joins the table's frontends to the
// Service ports of the daemon's report, and says where they disagree.
func TestStatusNFTTable(t *testing.T) {
	both := []string{"10.244.1.5:8080", "10.244.2.5:8080"}
	p := &nftables.Programmed{Table: "inet podnet", Chains: 12, Elements: 9, Frontends: []nftables.ProgrammedFrontend{
		{Address: "10.96.0.20:80", Protocol: "TCP", Chain: "svc-ip4-X", Endpoints: both},
		{Address: "10.96.0.30:80", Protocol: "TCP", Reject: true},
		{Address: "10.96.9.9:80", Protocol: "TCP", Chain: "svc-ip4-Y", Endpoints: []string{"10.244.3.3:80"}},
		{Address: ":30080", Protocol: "TCP", Chain: "ext-ip4-X", Endpoints: both[:1]},
	}}
	services := []proxy.ServiceStatus{
		{Namespace: "default", Name: "empty", Ports: []proxy.PortStatus{{Protocol: "TCP", Frontends: []string{"10.96.0.30:80"}, NoEndpoints: true}}},
		{Namespace: "default", Name: "gone", Ports: []proxy.PortStatus{{Protocol: "TCP", Frontends: []string{"10.96.0.31:80"},
			Endpoints: []proxy.EndpointStatus{{Address: "10.244.4.4:80", Cluster: true}}}}},
		{Namespace: "default", Name: "web", Ports: []proxy.PortStatus{{Name: "http", Protocol: "TCP", Frontends: []string{"10.96.0.20:80", ":30080"},
			Endpoints: []proxy.EndpointStatus{{Address: both[0], Cluster: true, Local: true}, {Address: both[1], Cluster: true}}}}},
	}
	m := compareNFTTable(p, services)
	wantDiff := []string{
		"default/gone TCP: frontend 10.96.0.31:80 is not in the table",
		"default/gone TCP: endpoints [10.244.4.4:80], in the table []",
		"frontend 10.96.9.9:80/TCP is in the table but of no Service proxyd reports",
	}
	if !slices.Equal(m.Differences, wantDiff) {
		t.Errorf("differences:\n%s\nwant:\n%s", strings.Join(m.Differences, "\n"), strings.Join(wantDiff, "\n"))
	}
	var out bytes.Buffer
	printStatus(&out, statusReport{ServiceProxy: proxy.Status{Mode: "nftables", Services: services}, NFTTable: m}, time.Now())
	text := out.String()
	for _, line := range [][]string{
		{"nftables", "table", "inet", "podnet:", "4", "frontends,", "12", "chains,", "9", "elements"},
		{"default/web:http", "10.96.0.20:80/TCP", "svc-ip4-X", "10.244.1.5:8080", "10.244.2.5:8080"},
		{"default/empty", "10.96.0.30:80/TCP", "reject", "none"},
		{"-", "10.96.9.9:80/TCP", "svc-ip4-Y", "10.244.3.3:80"},
	} {
		if !hasLine(text, line) {
			t.Errorf("proxyd status lacks the line %q:\n%s", strings.Join(line, " "), text)
		}
	}
}
