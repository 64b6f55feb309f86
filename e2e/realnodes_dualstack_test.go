//go:build conformance

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

// dualStackServiceYAML is a RequireDualStack NodePort Service in front of
// spreadYAML's web pods, IPv6 first in ipFamilies so that its primary
// cluster IP is not the family of the cluster's primary range.
const dualStackServiceYAML = `apiVersion: v1
kind: Service
metadata: {name: web-ds, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// TestRealNodesDualStack is the real-node lab as a dual-stack cluster
// (realClusterOptions.dualStack): kube-apiserver and
// kube-controller-manager with both families' ranges, kubelets with both
// node IPs, podnet with both cluster CIDRs. Every node has a podCIDR of
// each family and an InternalIP of each; every pod an address of each from
// its node's podCIDRs; pod to pod over each family on every pair of nodes
// (host-gw on the shared segment, VXLAN across the router); a
// RequireDualStack Service answers on both cluster IPs from every node and
// on its NodePort at every node's address of each family from outside and
// from every node itself; cluster DNS answers A and AAAA for it.
func TestRealNodesDualStack(t *testing.T) {
	testRealNodesDualStackOpts(t, realClusterOptions{dualStack: true})
}

func testRealNodesDualStackOpts(t *testing.T, o realClusterOptions) {
	c := startRealClusterOpts(t, realNodes(), o)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	names := []string{"node1", "node2", "node3"}
	c.applyYAML(ctx, spreadYAML(names)+"---\n"+dualStackServiceYAML)
	c.waitFor(3*time.Minute, "web on every node and the clients running", func(ctx context.Context) (bool, string) {
		return c.podsReady(ctx, "app=web", 3) && c.podsReady(ctx, "app=client", 3), ""
	})
	t.Run("nodes have a podCIDR and an InternalIP of each family", func(t *testing.T) {
		c.checkDualStackNodes(ctx, t)
	})
	webs, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("pods have an address of each family", func(t *testing.T) {
		pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			c.checkDualStackPod(ctx, t, &p)
		}
	})
	t.Run("pod to pod over each family on every pair of nodes", func(t *testing.T) {
		for _, from := range names {
			for _, w := range webs.Items {
				for _, ip := range w.Status.PodIPs {
					url := "http://" + netip.AddrPortFrom(netip.MustParseAddr(ip.IP), 8080).String() + "/"
					out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "get", url)
					if err != nil || !strings.HasPrefix(out, w.Name+" ") {
						t.Errorf("%s → %s on %s (%s): %q, %v", from, w.Name, w.Spec.NodeName, url, out, err)
					}
				}
			}
		}
	})
	svc, err := c.admin.CoreV1().Services("default").Get(ctx, "web-ds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("RequireDualStack Service on both cluster IPs from every node", func(t *testing.T) {
		c.checkDualStackService(ctx, t, svc, names)
	})
	t.Run("NodePort from outside at every node address of each family", func(t *testing.T) {
		for _, n := range c.l.Nodes {
			for _, a := range []netip.Addr{n.IP, n.IP6} {
				url := "http://" + netip.AddrPortFrom(a, uint16(svc.Spec.Ports[0].NodePort)).String() + "/"
				out, err := c.l.OutsideHost.Exec(ctx, c.testapp, "get", url)
				if err != nil || !strings.HasPrefix(out, "web-") {
					t.Errorf("outside → %s: %q, %v", url, out, err)
				}
			}
		}
	})
	t.Run("from every node itself to both cluster IPs and each family's NodePort", func(t *testing.T) {
		c.checkDualStackFromNodes(ctx, t, svc)
	})
	t.Run("DNS answers A and AAAA for the Service", func(t *testing.T) {
		for _, from := range names {
			out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "resolve", "web-ds.default.svc.cluster.local")
			got := strings.Fields(out)
			slices.Sort(got)
			want := slices.Clone(svc.Spec.ClusterIPs)
			slices.Sort(want)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("web-ds from %s: %q, %v; want the cluster IPs %v", from, out, err, svc.Spec.ClusterIPs)
			}
		}
	})
}

// checkDualStackNodes: every Node has two podCIDRs, IPv4 first (the
// primary family), from the cluster CIDR of each family, and an
// InternalIP of each family, its lab node's addresses.
func (c *realCluster) checkDualStackNodes(ctx context.Context, t *testing.T) {
	for _, ln := range c.l.Nodes {
		node, err := c.admin.CoreV1().Nodes().Get(ctx, ln.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidrs := node.Spec.PodCIDRs
		if len(cidrs) != 2 || node.Spec.PodCIDR != cidrs[0] ||
			!prefixWithin(cidrs[0], lab.ClusterCIDR, 24) || !prefixWithin(cidrs[1], lab.ClusterCIDR6, 64) {
			t.Errorf("node %s: podCIDR %q podCIDRs %q; want a /24 of %v and a /64 of %v", ln.Name, node.Spec.PodCIDR, cidrs, lab.ClusterCIDR, lab.ClusterCIDR6)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if want := []string{ln.IP.String(), ln.IP6.String()}; !slices.Equal(internal, want) {
			t.Errorf("node %s: InternalIPs %q, want %q", ln.Name, internal, want)
		}
	}
}

// prefixWithin says whether s is a prefix of bits bits inside outer.
func prefixWithin(s string, outer netip.Prefix, bits int) bool {
	p, err := netip.ParsePrefix(s)
	return err == nil && p.Bits() == bits && outer.Contains(p.Addr()) && p.Masked() == p
}

// checkDualStackPod: a pod of the pod network has two addresses, IPv4
// first, each in its node's podCIDR of that family.
func (c *realCluster) checkDualStackPod(ctx context.Context, t *testing.T, p *corev1.Pod) {
	node, err := c.admin.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) != 2 || p.Status.PodIP != ips[0] {
		t.Errorf("pod %s on %s: podIP %q podIPs %q; want two, the first the podIP", p.Name, p.Spec.NodeName, p.Status.PodIP, ips)
		return
	}
	for i, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			t.Errorf("pod %s: address %q: %v", p.Name, ip, err)
			continue
		}
		in, _ := netip.ParsePrefix(node.Spec.PodCIDRs[min(i, len(node.Spec.PodCIDRs)-1)])
		if !in.Contains(a) {
			t.Errorf("pod %s on %s: address %d %s is not in the node's podCIDR %v (podCIDRs %q)", p.Name, p.Spec.NodeName, i, a, in, node.Spec.PodCIDRs)
		}
	}
}

// checkDualStackService: the Service has a cluster IP of each family, in
// the order of its ipFamilies and from each family's Service range, and
// each answers from every node's client, reaching more than one web pod.
func (c *realCluster) checkDualStackService(ctx context.Context, t *testing.T, svc *corev1.Service, nodes []string) {
	ranges := map[corev1.IPFamily]netip.Prefix{
		corev1.IPv4Protocol: netip.MustParsePrefix(apiserver.ServiceCIDR),
		corev1.IPv6Protocol: netip.MustParsePrefix(serviceCIDR6),
	}
	if len(svc.Spec.ClusterIPs) != 2 || len(svc.Spec.IPFamilies) != 2 {
		t.Fatalf("Service %s: clusterIPs %q ipFamilies %q; want one of each family", svc.Name, svc.Spec.ClusterIPs, svc.Spec.IPFamilies)
	}
	for i, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err != nil || !ranges[svc.Spec.IPFamilies[i]].Contains(a) {
			t.Errorf("Service %s: cluster IP %q of family %s is not in %v", svc.Name, ip, svc.Spec.IPFamilies[i], ranges[svc.Spec.IPFamilies[i]])
		}
	}
	for _, from := range nodes {
		for _, ip := range svc.Spec.ClusterIPs {
			url := "http://" + netip.AddrPortFrom(netip.MustParseAddr(ip), 80).String() + "/"
			seen := map[string]bool{}
			for range 12 {
				out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "get", url)
				if err != nil || len(strings.Fields(out)) == 0 {
					t.Errorf("GET %s from %s: %v %q", url, from, err, out)
					break
				}
				seen[strings.Fields(out)[0]] = true
			}
			if len(seen) < 2 {
				t.Errorf("from %s the cluster IP %s reached only %v", from, ip, fmt.Sprint(seen))
			}
		}
	}
}

// checkDualStackFromNodes: a node's own processes (as a host-network pod's)
// reach the Service at each cluster IP and at the NodePort of every node's
// address of each family, its own included.
func (c *realCluster) checkDualStackFromNodes(ctx context.Context, t *testing.T, svc *corev1.Service) {
	port := uint16(svc.Spec.Ports[0].NodePort)
	var urls []string
	for _, ip := range svc.Spec.ClusterIPs {
		urls = append(urls, "http://"+netip.AddrPortFrom(netip.MustParseAddr(ip), 80).String()+"/")
	}
	for _, n := range c.l.Nodes {
		urls = append(urls, "http://"+netip.AddrPortFrom(n.IP, port).String()+"/", "http://"+netip.AddrPortFrom(n.IP6, port).String()+"/")
	}
	for _, n := range c.nodes {
		for _, url := range urls {
			out, err := n.Exec(ctx, c.testapp, "get", url)
			if err != nil || !strings.HasPrefix(out, "web-") {
				t.Errorf("node %s → %s: %q, %v", n.Name, url, out, err)
			}
		}
	}
}
