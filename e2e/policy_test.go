package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/policy"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// Issue 24: NetworkPolicy on the lab, checked against policy.Model. Pods in
// three namespaces on two nodes, every ordered pair × TCP and UDP, in each
// proxy mode.

const (
	polTCP = 8080
	polUDP = 8081
)

// polPolicies: red is closed to all but green's pods on TCP; green takes
// its own namespace only; blue's side-a pods may send only UDP, and only to
// red. (Namespaces are not x, y and z: YAML 1.1 reads y as true.)
var polPolicies = []string{`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: red, name: deny-in}
spec: {podSelector: {}, policyTypes: [Ingress]}`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: red, name: from-y-tcp}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: green}}}], ports: [{protocol: TCP, port: 8080}]}]`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: green, name: same-ns}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {}}]}]`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: blue, name: a-udp-to-x}
spec:
  podSelector: {matchLabels: {side: a}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {team: red}}}], ports: [{protocol: UDP, port: echo-udp}]}]`}

type polCluster struct {
	t      *testing.T
	svc    *svcCluster
	pods   []*polPod
	model  *policy.Model
	family ipfamily.Family
}

type polPod struct {
	ns, name, node string
	labels         map[string]string
	pod            *lab.Pod
}

func (p *polPod) key() string { return p.ns + "/" + p.name }

func TestNetworkPolicyMatrix(t *testing.T) {
	for _, mode := range svcModes {
		t.Run(mode, func(t *testing.T) { testPolicyMatrix(t, mode) })
	}
}

func polStart(t *testing.T, mode string) *polCluster {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	c := &polCluster{t: t, svc: &svcCluster{t: t, mode: mode, lab: l, proxyd: map[string]*lab.Proc{}}, family: l.Families[0]}
	for _, n := range l.Nodes {
		c.svc.startProxyd(n)
	}
	for _, n := range l.Nodes {
		waitUntil(t, 10*time.Second, func() bool { return svcFileExists(n.NodeConfigPath()) }, "node config of "+n.Name)
	}
	for _, ns := range []string{"red", "green", "blue"} {
		for _, side := range []string{"a", "b"} {
			node := map[string]string{"a": "node1", "b": "node2"}[side]
			p, err := l.Node(node).AddPod(t.Context(), ns[:1]+"_"+side)
			if err != nil {
				t.Fatal(err)
			}
			pp := &polPod{ns: ns, name: side, node: node, labels: map[string]string{"side": side}, pod: p}
			if _, err := p.StartEcho(lab.EchoOptions{Name: pp.key(), TCP: []string{fmt.Sprint(":", polTCP)}, UDP: []string{fmt.Sprint(":", polUDP)}}); err != nil {
				t.Fatal(err)
			}
			c.pods = append(c.pods, pp)
		}
	}
	c.writeState()
	return c
}

// writeState writes the namespaces and pods as a control plane would, and
// builds the model from the same objects.
func (c *polCluster) writeState() {
	var docs []string
	var cpods []*cluster.Pod
	var cns []*cluster.Namespace
	for _, ns := range []string{"red", "green", "blue"} {
		docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {team: %s}}", ns, ns))
		cns = append(cns, &cluster.Namespace{Name: ns, Labels: map[string]string{"team": ns}})
	}
	for _, p := range c.pods {
		var ips []string
		var addrs []netip.Addr
		for _, f := range c.svc.lab.Families {
			ips = append(ips, fmt.Sprintf("{ip: %q}", p.pod.IPOf(f)))
			addrs = append(addrs, p.pod.IPOf(f))
		}
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {namespace: %s, name: %s, labels: {side: %s}}
spec: {nodeName: %s, containers: [{name: echo, ports: [{name: echo-tcp, containerPort: %d}, {name: echo-udp, containerPort: %d, protocol: UDP}]}]}
status: {podIPs: [%s]}`, p.ns, p.name, p.labels["side"], p.node, polTCP, polUDP, strings.Join(ips, ", ")))
		cpods = append(cpods, &cluster.Pod{Namespace: p.ns, Name: p.name, NodeName: p.node, Labels: p.labels, IPs: addrs,
			Ports: []cluster.NamedPort{{Name: "echo-tcp", Protocol: cluster.TCP, Port: polTCP}, {Name: "echo-udp", Protocol: cluster.UDP, Port: polUDP}}})
	}
	if err := c.svc.lab.WriteState("policy-objects.yaml", strings.Join(docs, "\n---\n")); err != nil {
		c.t.Fatal(err)
	}
	var pols []*cluster.NetworkPolicy
	for _, d := range polPolicies {
		var np networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(d), &np); err != nil {
			c.t.Fatal(err)
		}
		cp, err := convert.FromV1NetworkPolicy(&np)
		if err != nil {
			c.t.Fatal(err)
		}
		pols = append(pols, cp)
	}
	c.model = policy.NewModel(cpods, cns, pols)
}

func (c *polCluster) writePolicies(docs []string) {
	if err := c.svc.lab.WriteState("policies.yaml", strings.Join(docs, "\n---\n")); err != nil {
		c.t.Fatal(err)
	}
}

type polProbe struct {
	from, to *polPod
	proto    string
	port     int
}

func (p polProbe) String() string {
	return fmt.Sprintf("%s -> %s %s/%d", p.from.key(), p.to.key(), p.proto, p.port)
}

// matrix probes every ordered pair over TCP and UDP at once and returns the
// probes whose outcome differs from want.
func (c *polCluster) matrix(ctx context.Context, want func(polProbe) bool) []string {
	var probes []polProbe
	for _, a := range c.pods {
		for _, b := range c.pods {
			if a != b {
				probes = append(probes, polProbe{a, b, "tcp", polTCP}, polProbe{a, b, "udp", polUDP})
			}
		}
	}
	var mu sync.Mutex
	var wrong []string
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Go(func() {
			addr := net.JoinHostPort(p.to.pod.IPOf(c.family).String(), fmt.Sprint(p.port))
			out, err := p.from.pod.Probe(ctx, p.proto, addr)
			got := err == nil && strings.HasPrefix(out, p.to.key()+" ")
			if w := want(p); got != w {
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("%s: reached %v, want %v (%q %v)", p, got, w, out, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return wrong
}

// modelSays is the model's verdict on a probe.
func (c *polCluster) modelSays(p polProbe) bool {
	proto := cluster.TCP
	if p.proto == "udp" {
		proto = cluster.UDP
	}
	return c.model.Evaluate(policy.Flow{Src: p.from.pod.IPOf(c.family), Dst: p.to.pod.IPOf(c.family), Protocol: proto, Port: uint16(p.port)}).Allowed
}

// awaitMatrix probes the matrix until it matches want, or fails with the
// last differences.
func (c *polCluster) awaitMatrix(what string, want func(polProbe) bool) {
	c.t.Helper()
	var wrong []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if wrong = c.matrix(c.t.Context(), want); len(wrong) == 0 {
			return
		}
	}
	c.t.Fatalf("%s: %d probes differ:\n%s", what, len(wrong), strings.Join(wrong, "\n"))
}

func testPolicyMatrix(t *testing.T, mode string) {
	c := polStart(t, mode)
	all := func(polProbe) bool { return true }
	c.awaitMatrix("no policy", all)
	c.writePolicies(polPolicies)
	c.awaitMatrix("policies", c.modelSays)
	denied := 0
	for _, a := range c.pods {
		for _, b := range c.pods {
			if a != b && !c.modelSays(polProbe{a, b, "tcp", polTCP}) {
				denied++
			}
		}
	}
	t.Logf("%s: matrix of %d pods × TCP/UDP matches the model (%d TCP pairs denied)", mode, len(c.pods), denied)
	if denied == 0 {
		t.Fatal("the policies deny nothing: the matrix proves nothing")
	}

	t.Run("a node reaches its own isolated pods (kubelet probes)", c.nodeReachesOwnPods)
	t.Run("proxyd logs denied new connections, rate-limited", c.deniedLog)

	t.Run("Service traffic is judged at the endpoint the proxy chose", func(t *testing.T) {
		red := []svcEndpoint{svcReady(c.pods[0].pod), svcReady(c.pods[1].pod)}
		c.svc.apply(svcDef{name: "red-web", clusterIP: "10.96.24.10", typ: "ClusterIP", endpoints: red,
			ports: []svcPort{{name: "tcp", proto: "TCP", port: 80, target: polTCP}}})
		vip := "10.96.24.10:80"
		green, blue := c.pods[2], c.pods[5]
		waitUntil(t, svcTimeout, func() bool {
			out, err := green.pod.Probe(t.Context(), "tcp", vip)
			return err == nil && strings.HasPrefix(out, "red/")
		}, "green reaches red through the Service")
		for range 4 {
			if out, err := blue.pod.Probe(t.Context(), "tcp", vip); err == nil {
				t.Errorf("%s reached red through the Service VIP: %q", blue.key(), out)
			}
		}
	})

	t.Run("a proxyd restart opens no window", func(t *testing.T) {
		n1 := c.svc.lab.Node("node1")
		if err := c.svc.proxyd["node1"].Stop(); err != nil {
			t.Logf("proxyd stop: %v", err)
		}
		// Down, and while it starts again: the table it left judges.
		if wrong := c.matrix(t.Context(), c.modelSays); len(wrong) > 0 {
			t.Errorf("with proxyd down on node1:\n%s", strings.Join(wrong, "\n"))
		}
		c.svc.startProxyd(n1)
		if wrong := c.matrix(t.Context(), c.modelSays); len(wrong) > 0 {
			t.Errorf("while proxyd starts on node1:\n%s", strings.Join(wrong, "\n"))
		}
	})

	t.Run("an established connection outlives a policy that denies it, new ones follow the policy", func(t *testing.T) {
		c.establishedOutlivesPolicy(t)
	})

	t.Run("policies removed", func(t *testing.T) {
		if err := c.svc.lab.RemoveState("policies.yaml"); err != nil {
			t.Fatal(err)
		}
		c.awaitMatrix("policies removed", all)
	})
}

// establishedOutlivesPolicy holds a TCP connection green/a -> red/a (allowed
// by from-y-tcp) and keeps it busy while from-y-tcp is deleted: once a new
// connection is refused (the new policy is enforced), the held one still
// echoes, as the table accepts established flows before it judges. The
// policies are restored after.
func (c *polCluster) establishedOutlivesPolicy(t *testing.T) {
	green, red := c.pods[2], c.pods[0]
	addr := net.JoinHostPort(red.pod.IPOf(c.family).String(), fmt.Sprint(polTCP))
	var conn net.Conn
	if err := ns.WithNetNSPath(green.pod.NSPath(), func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, red.key()+" ") {
		t.Fatalf("greeting %q, %v", line, err)
	}
	roundTrip := func(i int) error {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		msg := fmt.Sprintf("ping %d\n", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err == nil && got != msg {
			err = fmt.Errorf("echoed %q, want %q", got, msg)
		}
		return err
	}
	// Load on the held connection while the policy changes.
	stop, loadErr := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				loadErr <- nil
				return
			default:
			}
			if err := roundTrip(i); err != nil {
				loadErr <- err
				return
			}
		}
	}()
	c.writePolicies(slices.DeleteFunc(slices.Clone(polPolicies), func(d string) bool { return strings.Contains(d, "name: from-y-tcp") }))
	waitUntil(t, 30*time.Second, func() bool {
		_, err := green.pod.Probe(t.Context(), "tcp", addr)
		return err != nil
	}, "a new connection green -> red refused once from-y-tcp is gone")
	close(stop)
	if err := <-loadErr; err != nil {
		t.Errorf("the held connection broke while the policy changed: %v", err)
	}
	if err := roundTrip(-1); err != nil {
		t.Errorf("the held connection no longer echoes after the policy that allowed it went: %v", err)
	}
	c.writePolicies(polPolicies)
	c.awaitMatrix("policies restored", c.modelSays)
}
