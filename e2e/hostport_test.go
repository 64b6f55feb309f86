package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

// TestHostPort: a pod's hostPorts (the runtime's portMappings, handled by
// the portmap plugin chained after podnet, as flannel's conflist does) are
// reachable from outside the cluster at the node's address, TCP and UDP,
// and are gone once the pod is deleted.
func TestHostPort(t *testing.T) {
	c := rtStart(t, "auto", "node1", "node2")
	ctx := t.Context()
	n2 := c.lab.Node("node2")
	p, err := n2.AddPod(ctx, "hp",
		lab.PortMapping{HostPort: 8080, ContainerPort: 7070, Protocol: "tcp"},
		lab.PortMapping{HostPort: 8053, ContainerPort: 7070, Protocol: "udp"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.StartEcho(lab.EchoOptions{TCP: []string{":7070"}, UDP: []string{":7070"}}); err != nil {
		t.Fatal(err)
	}
	node := n2.IP.String()
	probe := func(proto, port string) (string, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return c.lab.OutsideHost.Probe(pctx, proto, node+":"+port)
	}
	for _, pp := range [][2]string{{"tcp", "8080"}, {"udp", "8053"}} {
		var out string
		var err error
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err = probe(pp[0], pp[1])
			if err == nil && strings.HasPrefix(out, "hp ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("outside → %s:%s/%s: %q, %v; want the pod hp", node, pp[1], pp[0], out, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("outside → %s:%s/%s answered %q", node, pp[1], pp[0], out)
	}
	// The node's own port 7070 (another pod's echo) is not what 8080 reaches:
	// a pod on node1 reaches the hostPort too, at node2's address.
	if out, err := c.pods["node1"].Probe(ctx, "tcp", node+":8080"); err != nil || !strings.HasPrefix(out, "hp ") {
		t.Errorf("pod on node1 → %s:8080: %q, %v; want the pod hp", node, out, err)
	}
	if err := n2.DeletePod(ctx, p); err != nil {
		t.Fatal(err)
	}
	if out, err := probe("tcp", "8080"); err == nil {
		t.Errorf("hostPort still answered %q after the pod was deleted", out)
	}
	if nat, _ := n2.Exec(ctx, "iptables-save", "-t", "nat"); strings.Contains(nat, fmt.Sprintf("--dport %d", 8080)) {
		t.Errorf("the hostPort's rule outlived the pod:\n%s", nat)
	}
}
