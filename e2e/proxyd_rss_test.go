package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkProxydRSS measures the resident memory of a real proxyd holding
// 10,000 ClusterIP Services × 10 endpoints from the state directory, in
// iptables and in ebpf mode side by side, once each, on node1 of a lab. It
// runs only with PODNET_BENCH=1, as scripts/bench-services.sh sets it.
func BenchmarkProxydRSS(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		b.Skip("set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	const services, endpoints = 10000, 10
	l := lab.Start(b, lab.Options{})
	var y strings.Builder
	for i := range services {
		vip := fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1)
		fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: default}\nspec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: p, protocol: TCP, port: 80, targetPort: 8080}]}\n", i, vip, vip)
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata: {name: s%05d-x, namespace: default, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: p, protocol: TCP, port: 8080}]\nendpoints:\n", i, i)
		for j := range endpoints {
			fmt.Fprintf(&y, "- {addresses: [10.%d.%d.%d], conditions: {ready: true}, nodeName: node2}\n", 245+j, i/250, i%250+1)
		}
	}
	if err := l.WriteState("rss-services.yaml", y.String()); err != nil {
		b.Fatal(err)
	}
	n := l.Node("node1")
	fmt.Printf("| mode | Services × endpoints | proxyd RSS after the first full sync | first sync took |\n|---|---|---|---|\n")
	for b.Loop() {
		// ebpf first: it leaves nothing in iptables, while the 100,000
		// rules iptables mode leaves make every iptables-save of the next
		// proxyd's node agent (and ebpf mode's removal of them) take seconds.
		for _, mode := range []string{"ebpf", "iptables"} {
			start := time.Now()
			p, err := n.StartProxyd(b.Context(), "--proxy-mode", mode, "--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
			if err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Minute)
			for {
				code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
				if err == nil && code == 200 {
					fams := metricstest.Parse(b, body)
					if v, ok := metricstest.Value(fams, "podnet_proxy_service_ports"); ok && v >= services {
						break
					}
				}
				if time.Now().After(deadline) {
					b.Fatalf("%s mode: no sync of %d Services within 5 minutes", mode, services)
				}
				time.Sleep(100 * time.Millisecond)
			}
			took := time.Since(start)
			rss := procRSS(strconv.Itoa(p.Pid()))
			fmt.Printf("| %s | %d × %d | %d MiB | %.1f s |\n", mode, services, endpoints, rss>>10, took.Seconds())
			if err := p.Stop(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
