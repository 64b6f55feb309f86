package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/podnet/podnet/dataplane/agent"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// Tests of issue 4: proxyd gives every node its podCIDR and routes to every
// other node's pods, host-gw on a shared segment and VXLAN across the
// router. Each test runs proxyd on the lab's nodes with --proxy-mode none
// and checks packets between real pods.

const (
	rtEchoPort   = "7070"
	rtHealthAddr = "127.0.0.1:10256"
)

// rtCluster is a lab with proxyd on some of its nodes and one echo pod on
// each of those.
type rtCluster struct {
	t       *testing.T
	lab     *lab.Lab
	backend string
	nodes   []*lab.Node
	proxyd  map[string]*lab.Proc
	pods    map[string]*lab.Pod // by node name
}

func rtProxydArgs(l *lab.Lab, n *lab.Node, backend string) []string {
	return []string{
		filepath.Join(l.BinDir, "proxyd"),
		"--node-name", n.Name,
		"--state-dir", l.StateDir(),
		"--node-config", n.NodeConfigPath(),
		"--backend", backend,
		"--proxy-mode", "none",
		"--healthz-bind-address", rtHealthAddr,
		"--metrics-bind-address", "127.0.0.1:10249",
		// --sync-period and --min-sync-period keep their defaults (30 s,
		// 1 s): the 2 s promises below must hold with them.
	}
}

func rtStart(t *testing.T, backend string, nodeNames ...string) *rtCluster {
	t.Helper()
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	c := &rtCluster{t: t, lab: l, backend: backend, proxyd: map[string]*lab.Proc{}, pods: map[string]*lab.Pod{}}
	if len(nodeNames) == 0 {
		c.nodes = l.Nodes
	} else {
		for _, name := range nodeNames {
			c.nodes = append(c.nodes, l.Node(name))
		}
	}
	for _, n := range c.nodes {
		c.startProxyd(n)
	}
	ctx := t.Context()
	for _, n := range c.nodes {
		c.waitHealthy(n)
		cfg, err := nodeconfig.Read(n.NodeConfigPath())
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		wantMTU := lab.UnderlayMTU - 50
		if backend == "host-gw" {
			wantMTU = lab.UnderlayMTU
		}
		if cfg.PodCIDR != n.PodCIDR || cfg.ClusterCIDR != lab.ClusterCIDR || cfg.MTU != wantMTU {
			t.Fatalf("%s: node config %+v, want podCIDR %s, cluster %s, mtu %d", n.Name, cfg, n.PodCIDR, lab.ClusterCIDR, wantMTU)
		}
		p, err := n.AddPod(ctx, "p"+strings.TrimPrefix(n.Name, "node"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.StartEcho(lab.EchoOptions{TCP: []string{":" + rtEchoPort}, UDP: []string{":" + rtEchoPort}}); err != nil {
			t.Fatal(err)
		}
		c.pods[n.Name] = p
	}
	return c
}

func (c *rtCluster) startProxyd(n *lab.Node) {
	c.t.Helper()
	p, err := n.Start("proxyd", rtProxydArgs(c.lab, n, c.backend)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.proxyd[n.Name] = p
}

// rtHTTPGet does a GET from inside the namespace at nsPath. The socket is
// made inside ns.Do, so it belongs to that namespace for its whole life.
func rtHTTPGet(nsPath, addr, path string) (int, string, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	})
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	data, err := io.ReadAll(conn)
	if err != nil {
		return 0, "", err
	}
	head, body, _ := strings.Cut(string(data), "\r\n\r\n")
	var code int
	if _, err := fmt.Sscanf(head, "HTTP/1.0 %d", &code); err != nil {
		if _, err := fmt.Sscanf(head, "HTTP/1.1 %d", &code); err != nil {
			return 0, "", fmt.Errorf("bad response %q", head)
		}
	}
	return code, body, nil
}

// waitHealthy waits until the node's proxyd is healthy and says, on its
// status board, that every part of it is ready: the node network synced.
func (c *rtCluster) waitHealthy(n *lab.Node) {
	c.t.Helper()
	waitProxydReady(c.t, n, c.proxyd[n.Name])
}

// waitProxydReady waits until proxyd p of node n answers /healthz with 200
// and every component on its status board is ok (the node network synced:
// its routes are in the kernel).
func waitProxydReady(t *testing.T, n *lab.Node, p *lab.Proc) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		code, body, err := rtHTTPGet(n.NSPath(), rtHealthAddr, "/healthz")
		if err == nil && code == 200 {
			var st struct {
				Health agent.HealthStatus `json:"health"`
			}
			_, sbody, serr := rtHTTPGet(n.NSPath(), "127.0.0.1:10249", "/status")
			ready := serr == nil && json.Unmarshal([]byte(sbody), &st) == nil && len(st.Health.Components) > 0
			for _, v := range st.Health.Components {
				ready = ready && v == "ok"
			}
			if ready {
				return
			}
			body = sbody
		}
		last = fmt.Sprintf("%d %q %v", code, body, err)
		select {
		case <-p.Done():
			t.Fatalf("%s: proxyd exited: %s", n.Name, p.Output())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("%s: /healthz not ok after 10 s: %s\n%s", n.Name, last, p.Output())
}

// matrix probes TCP and UDP echo from every pod to every pod on another
// node, and checks each answer came from the right pod and saw the client
// pod's own address (pod to pod is never masqueraded).
func (c *rtCluster) matrix(ctx context.Context) {
	c.t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	sem := make(chan struct{}, 4)
	for from, src := range c.pods {
		for to, dst := range c.pods {
			if from == to {
				continue
			}
			for _, proto := range []string{"tcp", "udp"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					addr := net.JoinHostPort(dst.IP.String(), rtEchoPort)
					ans, err := src.Probe(ctx, proto, addr)
					want := dst.Name + " " + src.IP.String() + ":"
					if err == nil && !strings.HasPrefix(ans, want) {
						err = fmt.Errorf("answer %q, want %q...", ans, want)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, fmt.Sprintf("%s %s(%s) → %s(%s): %v", proto, from, src.IP, to, addr, err))
						mu.Unlock()
					}
				}()
			}
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		c.t.Fatalf("pod matrix (%s):\n%s", c.backend, strings.Join(errs, "\n"))
	}
}

func (c *rtCluster) routes(n *lab.Node) string {
	c.t.Helper()
	out, err := n.Exec(c.t.Context(), "ip", "-4", "route", "show", "proto", "98")
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// waitFor polls cond every 50 ms until it holds or limit passes, and
// returns how long it took.
func rtWaitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

func rtNodesYAML(nodes []*lab.Node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Node
metadata:
  name: %s
  labels:
    topology.kubernetes.io/zone: %q
spec:
  podCIDR: %s
status:
  addresses:
  - type: InternalIP
    address: %s
`, n.Name, n.Zone, n.PodCIDR, n.IP)
	}
	return b.String()
}

// rtPingDF sends one ICMP echo of size bytes (IP header included) with
// Don't Fragment set from inside the namespace at nsPath and waits for the
// reply.
func rtPingDF(nsPath string, dst netip.Addr, size int) error {
	var conn *net.IPConn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		pc, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		conn = pc.(*net.IPConn)
		return nil
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
	}); err != nil || serr != nil {
		return errors.Join(err, serr)
	}
	id := os.Getpid() & 0xffff
	payload := make([]byte, size-20-8)
	binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: size, Data: payload}}
	wb, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Second)
	_ = conn.SetDeadline(deadline)
	for attempt := 0; attempt < 3; attempt++ {
		if _, err := conn.WriteTo(wb, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return fmt.Errorf("send %d bytes with DF: %w", size, err)
		}
		rb := make([]byte, 64<<10)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, from, err := conn.ReadFrom(rb)
			if err != nil {
				break // resend
			}
			m, err := icmp.ParseMessage(1, rb[:n])
			if err != nil {
				continue
			}
			switch m.Type {
			case ipv4.ICMPTypeEchoReply:
				if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == size && len(e.Data) == len(payload) && from.String() == dst.String() {
					return nil
				}
			case ipv4.ICMPTypeDestinationUnreachable:
				return fmt.Errorf("%d bytes with DF: destination unreachable (fragmentation needed?) from %s", size, from)
			}
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return fmt.Errorf("%d bytes with DF to %s: no reply", size, dst)
}

// rtConn opens a TCP connection from the pod to addr and reads the echo
// server's greeting.
func rtConn(p *lab.Pod, addr string) (net.Conn, *bufio.Reader, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(p.NSPath(), func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, r, nil
}

func rtRoundTrip(conn net.Conn, r *bufio.Reader, msg string) error {
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(conn, msg); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != msg {
		return fmt.Errorf("echo %q, want %q", line, msg)
	}
	return nil
}

// TestRoutingAuto is the default backend end to end: host-gw among
// node1-3, VXLAN to and from node4 behind the router.
func TestRoutingAuto(t *testing.T) {
	c := rtStart(t, "auto")
	ctx := t.Context()
	n1, n2, n3, n4 := c.lab.Node("node1"), c.lab.Node("node2"), c.lab.Node("node3"), c.lab.Node("node4")

	// The plan as the kernel holds it: host-gw on the segment, VXLAN across.
	r1 := c.routes(n1)
	for _, want := range []string{
		fmt.Sprintf("%s via %s dev eth0", n2.PodCIDR, n2.IP),
		fmt.Sprintf("%s via %s dev podnet.1 onlink", n4.PodCIDR, n4.PodCIDR.Addr()),
	} {
		if !strings.Contains(r1, want) {
			t.Errorf("node1 routes lack %q:\n%s", want, r1)
		}
	}
	c.matrix(ctx)

	t.Run("a host FORWARD policy of DROP does not cut pods off", func(t *testing.T) {
		for _, n := range c.nodes {
			if _, err := n.Exec(ctx, "iptables", "-P", "FORWARD", "DROP"); err != nil {
				t.Fatal(err)
			}
		}
		c.matrix(ctx)
		out, err := n1.Exec(ctx, "iptables", "-nvxL", "PODNET-FORWARD")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^\s+[1-9]\d*\s+\d+\s+ACCEPT`).MatchString(out) {
			t.Errorf("PODNET-FORWARD accepted nothing:\n%s", out)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		code, body, err := rtHTTPGet(n1.NSPath(), "127.0.0.1:10249", "/metrics")
		if err != nil || code != 200 {
			t.Fatalf("/metrics: %d %v", code, err)
		}
		for _, want := range []string{`podnet_peers{backend="host-gw"} 2`, `podnet_peers{backend="vxlan"} 1`, "podnet_node_network_syncs_total"} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})

	t.Run("full-size packets with DF cross VXLAN", func(t *testing.T) {
		// Control: one byte over the pod MTU with DF cannot leave the pod.
		if err := rtPingDF(c.pods["node1"].NSPath(), c.pods["node4"].IP, lab.UnderlayMTU-50+1); err == nil {
			t.Errorf("a %d-byte DF ping crossed a %d-byte pod MTU", lab.UnderlayMTU-50+1, lab.UnderlayMTU-50)
		}
		for _, size := range []int{1400, lab.UnderlayMTU - 50} {
			if err := rtPingDF(c.pods["node1"].NSPath(), c.pods["node4"].IP, size); err != nil {
				t.Errorf("pod node1 → pod node4: %v", err)
			}
			if err := rtPingDF(c.pods["node4"].NSPath(), c.pods["node2"].IP, size); err != nil {
				t.Errorf("pod node4 → pod node2: %v", err)
			}
		}
	})

	t.Run("without podnet's route there is no path", func(t *testing.T) {
		// The control for every matrix: with proxyd stopped and the route
		// gone, node1's pod cannot reach node3's; the restarted proxyd
		// puts the route back and the path with it.
		if err := c.proxyd["node1"].Stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := n1.Exec(ctx, "ip", "route", "del", n3.PodCIDR.String()); err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort(c.pods["node3"].IP.String(), rtEchoPort)
		if ans, err := c.pods["node1"].Probe(ctx, "udp", addr); err == nil {
			t.Fatalf("node1 pod reached node3 pod without a route: %q", ans)
		}
		c.startProxyd(n1)
		c.waitHealthy(n1)
		if _, err := c.pods["node1"].Probe(ctx, "udp", addr); err != nil {
			t.Fatalf("after proxyd restart: %v", err)
		}
	})

	t.Run("pods reach outside with their node's address", func(t *testing.T) {
		if _, err := c.lab.OutsideHost.StartEcho(lab.EchoOptions{Name: "outside", TCP: []string{":" + rtEchoPort}, UDP: []string{":" + rtEchoPort}}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []*lab.Node{n1, n4} {
			for _, proto := range []string{"tcp", "udp"} {
				ans, err := c.pods[n.Name].Probe(ctx, proto, net.JoinHostPort(c.lab.OutsideIP.String(), rtEchoPort))
				if err != nil {
					t.Fatalf("%s pod → outside %s: %v", n.Name, proto, err)
				}
				if want := "outside " + n.IP.String() + ":"; !strings.HasPrefix(ans, want) {
					t.Errorf("%s pod → outside %s: answer %q, want source %s", n.Name, proto, ans, n.IP)
				}
			}
		}
	})

	t.Run("a route deleted by hand comes back", func(t *testing.T) {
		for _, cidr := range []netip.Prefix{n3.PodCIDR, n4.PodCIDR} {
			if _, err := n1.Exec(ctx, "ip", "route", "del", cidr.String()); err != nil {
				t.Fatal(err)
			}
			took := rtWaitFor(t, "route "+cidr.String()+" back", 3*time.Second, func() bool {
				return strings.Contains(c.routes(n1), cidr.String())
			})
			t.Logf("route %s back after %v", cidr, took.Round(time.Millisecond))
		}
		if _, err := n1.Exec(ctx, "ip", "neigh", "del", n4.PodCIDR.Addr().String(), "dev", "podnet.1"); err != nil {
			t.Fatal(err)
		}
		rtWaitFor(t, "neighbour back", 3*time.Second, func() bool {
			out, _ := n1.Exec(ctx, "ip", "neigh", "show", "dev", "podnet.1")
			return strings.Contains(out, n4.PodCIDR.Addr().String()+" lladdr")
		})
	})

	t.Run("a TCP stream survives a proxyd restart", func(t *testing.T) {
		var conns []net.Conn
		type stream struct {
			conn net.Conn
			r    *bufio.Reader
			name string
		}
		var streams []stream
		for _, pair := range [][2]string{{"node1", "node2"}, {"node1", "node4"}} {
			conn, r, err := rtConn(c.pods[pair[0]], net.JoinHostPort(c.pods[pair[1]].IP.String(), rtEchoPort))
			if err != nil {
				t.Fatalf("%s → %s: %v", pair[0], pair[1], err)
			}
			conns = append(conns, conn)
			streams = append(streams, stream{conn, r, pair[0] + "→" + pair[1]})
		}
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for _, s := range streams {
			if err := rtRoundTrip(s.conn, s.r, "before "+s.name); err != nil {
				t.Fatalf("%s before restart: %v", s.name, err)
			}
		}
		for _, name := range []string{"node1", "node2", "node4"} {
			n := c.lab.Node(name)
			if err := c.proxyd[name].Stop(); err != nil {
				t.Fatalf("%s: proxyd exited badly: %v\n%s", name, err, c.proxyd[name].Output())
			}
			c.startProxyd(n)
		}
		for _, name := range []string{"node1", "node2", "node4"} {
			c.waitHealthy(c.lab.Node(name))
			// A restart finds everything right and changes nothing.
			if out := c.proxyd[name].Output(); strings.Contains(out, "node network changed") || strings.Contains(out, "node firewall written") {
				t.Errorf("%s: restarted proxyd changed the kernel state:\n%s", name, out)
			}
		}
		for _, s := range streams {
			if err := rtRoundTrip(s.conn, s.r, "after "+s.name); err != nil {
				t.Errorf("%s after restart: %v", s.name, err)
			}
		}
	})

	t.Run("a broken state file is reported and the rest keeps working", func(t *testing.T) {
		if err := c.lab.WriteState("zz-broken.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n  bad: [unclosed\n"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.lab.RemoveState("zz-broken.yaml") })
		re := regexp.MustCompile(`zz-broken\.yaml:\d+`)
		rtWaitFor(t, "broken file reported by proxyd", 3*time.Second, func() bool {
			return re.MatchString(c.proxyd["node1"].Output())
		})
		// Health does not depend on an unrelated broken file.
		if code, body, err := rtHTTPGet(n1.NSPath(), rtHealthAddr, "/healthz"); err != nil || code != 200 {
			t.Errorf("/healthz with a broken file: %d %q %v", code, body, err)
		}
		// Changes in other files are still followed (next subtest relies
		// on it too), and traffic keeps flowing.
		c.matrix(ctx)
	})

	t.Run("removing a Node removes its routes within 2 s", func(t *testing.T) {
		var keep []*lab.Node
		for _, n := range c.lab.Nodes {
			if n != n3 && n != n4 {
				keep = append(keep, n)
			}
		}
		// The lab wrote nodes.yaml; replace it with node3 and node4 gone.
		if err := c.lab.WriteState("nodes.yaml", rtNodesYAML(keep)); err != nil {
			t.Fatal(err)
		}
		took := rtWaitFor(t, "node3 and node4 routes removed", 2*time.Second, func() bool {
			r := c.routes(n1)
			return !strings.Contains(r, n3.PodCIDR.String()) && !strings.Contains(r, n4.PodCIDR.String())
		})
		t.Logf("routes gone after %v", took.Round(time.Millisecond))
		out, _ := n1.Exec(ctx, "ip", "neigh", "show", "dev", "podnet.1")
		fdb, _ := n1.Exec(ctx, "bridge", "fdb", "show", "dev", "podnet.1")
		if strings.Contains(out, n4.PodCIDR.Addr().String()) || strings.Contains(fdb, n4.IP.String()) {
			t.Errorf("node4's neighbour/FDB entries left:\n%s\n%s", out, fdb)
		}
		if strings.Contains(c.routes(n1), n2.PodCIDR.String()) == false {
			t.Errorf("node2's route went too")
		}
		// And back.
		if err := c.lab.WriteState("nodes.yaml", rtNodesYAML(c.lab.Nodes)); err != nil {
			t.Fatal(err)
		}
		rtWaitFor(t, "routes back", 2*time.Second, func() bool {
			r := c.routes(n1)
			return strings.Contains(r, n3.PodCIDR.String()) && strings.Contains(r, n4.PodCIDR.String())
		})
	})
}

func TestRoutingVXLAN(t *testing.T) {
	c := rtStart(t, "vxlan")
	n1, n2 := c.lab.Node("node1"), c.lab.Node("node2")
	if r := c.routes(n1); !strings.Contains(r, fmt.Sprintf("%s via %s dev podnet.1 onlink", n2.PodCIDR, n2.PodCIDR.Addr())) {
		t.Errorf("node1 does not use VXLAN to node2:\n%s", r)
	}
	c.matrix(t.Context())
	if err := rtPingDF(c.pods["node1"].NSPath(), c.pods["node2"].IP, 1400); err != nil {
		t.Error(err)
	}

	// proxyd --cleanup removes its device, routes and chains.
	if err := c.proxyd["node1"].Stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := n1.Exec(t.Context(), filepath.Join(c.lab.BinDir, "proxyd"), "--cleanup", "--proxy-mode", "none"); err != nil {
		t.Fatalf("proxyd --cleanup: %v\n%s", err, out)
	}
	if r := c.routes(n1); strings.TrimSpace(r) != "" {
		t.Errorf("routes left after --cleanup:\n%s", r)
	}
	if out, err := n1.Exec(t.Context(), "ip", "link", "show", "podnet.1"); err == nil {
		t.Errorf("podnet.1 left after --cleanup:\n%s", out)
	}
	if out, _ := n1.Exec(t.Context(), "iptables-save"); strings.Contains(out, "PODNET-") {
		t.Errorf("chains left after --cleanup:\n%s", out)
	}
}

// TestRoutingHostGW forces host-gw among the nodes of one segment.
func TestRoutingHostGW(t *testing.T) {
	c := rtStart(t, "host-gw", "node1", "node2", "node3")
	n1, n2 := c.lab.Node("node1"), c.lab.Node("node2")
	r := c.routes(n1)
	if !strings.Contains(r, fmt.Sprintf("%s via %s dev eth0", n2.PodCIDR, n2.IP)) || strings.Contains(r, "podnet.1") {
		t.Errorf("node1 routes with host-gw:\n%s", r)
	}
	if out, err := n1.Exec(t.Context(), "ip", "link", "show", "podnet.1"); err == nil {
		t.Errorf("host-gw created a VXLAN device:\n%s", out)
	}
	c.matrix(t.Context())
}
