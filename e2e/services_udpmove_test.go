package e2e

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

// Tests of issue 25: what Kubernetes' e2e specs beyond the conformance
// focus found. "Conntrack should be able to cleanup conntrack entries when
// UDP service target port changes" and "Services should fail health check
// node port if there are only terminating endpoints", in both modes.

func TestServicesUDPFlowsMoveAndHealthChecks(t *testing.T) {
	for _, mode := range svcModes {
		t.Run(mode, func(t *testing.T) { testUDPFlowsMove(t, mode) })
	}
}

func testUDPFlowsMove(t *testing.T, mode string) {
	c := svcStart(t, mode)
	l := c.lab
	n1, n2 := l.Node("node1"), l.Node("node2")
	// One pod answers as backend1 on 6001 and as backend2 on 6002, so a
	// targetPort change keeps the endpoint's address and moves only its
	// port: entries told apart by address alone would stay.
	srv, err := n2.AddPod(t.Context(), "udpsrv")
	if err != nil {
		t.Fatal(err)
	}
	for name, port := range map[string]string{"backend1": ":6001", "backend2": ":6002"} {
		if _, err := srv.StartEcho(lab.EchoOptions{Name: name, UDP: []string{port}}); err != nil {
			t.Fatal(err)
		}
	}
	udpSvc := func(name, ip, typ string, target, nodePort int) svcDef {
		return svcDef{name: name, clusterIP: ip, typ: typ,
			ports:     []svcPort{{name: "udp", proto: "UDP", port: 80, target: target, nodePort: nodePort}},
			endpoints: []svcEndpoint{svcReady(srv)}}
	}
	// Another Service keeps sending to backend1, so the endpoint a moved
	// Service leaves is still in use: what went is one (frontend, backend)
	// pair, not the endpoint (ebpf mode destroys the sockets and expires
	// the flows of that pair alone).
	c.apply(udpSvc("udpmove-stays", "10.96.25.13", "ClusterIP", 6001, 0))
	for _, tt := range []struct {
		name, addr string
		from       string // namespace path
		start      func(addr string) (*lab.UDPAsker, error)
		def        func(target int) svcDef
	}{
		{"ClusterIP from a pod on another node", "10.96.25.10:80", c.c1.NSPath(), c.c1.StartUDPAsker,
			func(target int) svcDef { return udpSvc("udpmove", "10.96.25.10", "ClusterIP", target, 0) }},
		{"NodePort from outside", net.JoinHostPort(n1.IP.String(), "30725"), l.OutsideHost.NSPath(), l.OutsideHost.StartUDPAsker,
			func(target int) svcDef { return udpSvc("udpmove-np", "10.96.25.11", "NodePort", target, 30725) }},
		// A pod's socket to its own node's NodePort: in ebpf mode socket
		// LB translates it at connect, as it does a cluster IP.
		{"NodePort from a pod on the node", net.JoinHostPort(n1.IP.String(), "30727"), c.c1.NSPath(), c.c1.StartUDPAsker,
			func(target int) svcDef { return udpSvc("udpmove-np-pod", "10.96.25.14", "NodePort", target, 30727) }},
	} {
		t.Run("UDP flow follows a targetPort change: "+tt.name, func(t *testing.T) {
			c.apply(tt.def(6001))
			// Socket LB translates a socket when it connects: one that
			// connected before the Service existed would never be.
			c.eventuallyServes(t, tt.from, "udp", tt.addr, "backend1")
			// The client is a process of the pod (or the outside host),
			// in its cgroup, as a real one is: ebpf mode finds the
			// sockets to destroy through the cgroup's processes.
			a, err := tt.start(tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			awaitAnswer(t, a, "backend1", svcTimeout)
			// The flow is established: several answers in a row, all
			// from backend1, from the one source port.
			for range 5 {
				if got, err := a.Ask(); got != "ok backend1" {
					t.Fatalf("before the change: %q, %v; want ok backend1", got, err)
				}
			}
			changed := time.Now()
			c.apply(tt.def(6002))
			redials := awaitAnswer(t, a, "backend2", svcTimeout)
			t.Logf("%s: moved to the new targetPort %v after the change (socket dialled again: %d)", mode, time.Since(changed).Round(time.Millisecond), redials)
		})
	}

	t.Run("healthCheckNodePort: a node whose only local endpoint is terminating answers 503", func(t *testing.T) {
		def := svcDef{name: "hc-term", clusterIP: "10.96.25.12", typ: "NodePort", etpLocal: true, healthCheckNodePort: 32725,
			ports:     []svcPort{{name: "tcp", proto: "TCP", port: 80, target: 9090, nodePort: 30726}},
			endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}}
		c.apply(def)
		hc := func(n *lab.Node) (int, string) {
			code, body, err := svcHTTPGet(l.OutsideHost.NSPath(), net.JoinHostPort(n.IP.String(), "32725"))
			if err != nil {
				return 0, err.Error()
			}
			return code, body
		}
		waitUntil(t, svcTimeout, func() bool { code, _ := hc(n1); return code == 200 }, "health check 200 on node1 with a ready local endpoint")
		// web1 starts terminating: still serving, no longer ready.
		def.endpoints[0] = svcEndpoint{pod: c.web1, serving: true, terminating: true}
		c.apply(def)
		waitUntil(t, svcTimeout, func() bool { code, _ := hc(n1); return code == 503 }, "health check 503 on node1 with only a terminating local endpoint")
		if code, body := hc(n1); !strings.Contains(body, `"localEndpoints":0`) {
			t.Errorf("node1 health check: %d %s; want localEndpoints 0", code, body)
		}
		if code, body := hc(n2); code != 200 || !strings.Contains(body, `"localEndpoints":1`) {
			t.Errorf("node2 health check: %d %s; want 200 with its ready endpoint", code, body)
		}
		// Traffic that still reaches node1 is served by its terminating
		// endpoint (kube-proxy's fallback), though the node asks load
		// balancers to go elsewhere.
		c.eventuallyServes(t, l.OutsideHost.NSPath(), "tcp", net.JoinHostPort(n1.IP.String(), "30726"), "web1")
	})
}

// awaitAnswer keeps asking, ten queries a second, until want answers; it
// fails the test after timeout with the answers seen. It returns how many
// times the client dialled again.
func awaitAnswer(t *testing.T, a *lab.UDPAsker, want string, timeout time.Duration) int {
	t.Helper()
	seen := make(map[string]int)
	redials := 0
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got, err := a.Ask()
		if err != nil {
			t.Fatal(err)
		}
		if got == "ok "+want {
			return redials
		}
		if strings.HasPrefix(got, "redial ") {
			redials++
			got = "redial"
		}
		seen[got]++
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no answer from %s within %v; answers %v", want, timeout, seen)
	return redials
}
