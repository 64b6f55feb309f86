package podcidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

var clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")

func addNode(t *testing.T, c kubernetes.Interface, name, podCIDR string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func nodeCIDR(t *testing.T, c kubernetes.Interface, name string) string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.PodCIDR
}

func TestLeaseName(t *testing.T) {
	p := netip.MustParsePrefix("10.244.3.0/24")
	if got := LeaseName(p); got != "podcidr-10.244.3.0-24" {
		t.Errorf("LeaseName = %q", got)
	}
	if got, ok := ParseLeaseName(LeaseName(p)); !ok || got != p {
		t.Errorf("ParseLeaseName(LeaseName(%v)) = %v, %v", p, got, ok)
	}
	p6 := netip.MustParsePrefix("fd00:244:0:3::/64")
	if got := LeaseName(p6); got != "podcidr-fd000244000000030000000000000000-64" {
		t.Errorf("LeaseName(%v) = %q", p6, got)
	}
	if got, ok := ParseLeaseName(LeaseName(p6)); !ok || got != p6 {
		t.Errorf("ParseLeaseName(LeaseName(%v)) = %v, %v", p6, got, ok)
	}
	for _, bad := range []string{"node1", "podcidr-10.244.3.1-24", "podcidr-x-24", "podcidr-10.244.3.0", "podcidr-fd000244000000030000000000000001-64"} {
		if _, ok := ParseLeaseName(bad); ok {
			t.Errorf("ParseLeaseName(%q) accepted", bad)
		}
	}
}

func TestKeepsExistingPodCIDR(t *testing.T) {
	c := fake.NewClientset()
	addNode(t, c, "n1", "10.244.7.0/24")
	got, err := Ensure(context.Background(), Options{Client: c, NodeName: "n1", ClusterCIDR: clusterCIDR})
	if err != nil || got.String() != "10.244.7.0/24" {
		t.Fatalf("Ensure = %v, %v; want the Node's 10.244.7.0/24", got, err)
	}
	leases, _ := c.CoordinationV1().Leases(DefaultNamespace).List(context.Background(), metav1.ListOptions{})
	if len(leases.Items) != 0 {
		t.Errorf("claimed %d Leases for a node that has a podCIDR", len(leases.Items))
	}
}

func TestClaimsFirstFreeSubnet(t *testing.T) {
	c := fake.NewClientset()
	addNode(t, c, "n0", "10.244.0.0/24")
	addNode(t, c, "n1", "10.244.2.0/24")
	addNode(t, c, "new", "")
	ctx := context.Background()
	got, err := Ensure(ctx, Options{Client: c, NodeName: "new", ClusterCIDR: clusterCIDR})
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "10.244.1.0/24" {
		t.Errorf("claimed %v, want the first free 10.244.1.0/24", got)
	}
	if s := nodeCIDR(t, c, "new"); s != "10.244.1.0/24" {
		t.Errorf("Node.spec.podCIDR = %q", s)
	}
	l, err := c.CoordinationV1().Leases(DefaultNamespace).Get(ctx, "podcidr-10.244.1.0-24", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "new" || len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "uid-new" {
		t.Errorf("claim Lease: holder %q, owners %+v; want held and owned by node new", *l.Spec.HolderIdentity, l.OwnerReferences)
	}
	// Idempotent: a second call changes nothing.
	again, err := Ensure(ctx, Options{Client: c, NodeName: "new", ClusterCIDR: clusterCIDR})
	if err != nil || again != got {
		t.Errorf("second Ensure = %v, %v; want %v", again, err, got)
	}
}

// A node that crashed after claiming but before writing its Node reuses its
// claim instead of taking a second subnet.
func TestReusesOwnClaimAfterCrash(t *testing.T) {
	c := fake.NewClientset()
	addNode(t, c, "n1", "")
	o := Options{Client: c, NodeName: "n1", ClusterCIDR: clusterCIDR}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	node, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	p := netip.MustParsePrefix("10.244.5.0/24")
	if _, err := c.CoordinationV1().Leases(DefaultNamespace).Create(context.Background(), o.lease(node, p), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := Ensure(context.Background(), o)
	if err != nil || got != p {
		t.Fatalf("Ensure = %v, %v; want the claim it already held, %v", got, err, p)
	}
}

func TestExhausted(t *testing.T) {
	c := fake.NewClientset()
	small := netip.MustParsePrefix("10.244.0.0/23")
	addNode(t, c, "a", "10.244.0.0/24")
	addNode(t, c, "b", "10.244.1.0/24")
	addNode(t, c, "c", "")
	_, err := Ensure(context.Background(), Options{Client: c, NodeName: "c", ClusterCIDR: small})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("Ensure = %v, want ErrExhausted", err)
	}
}

func TestValidate(t *testing.T) {
	c := fake.NewClientset()
	for _, o := range []Options{
		{NodeName: "n", ClusterCIDR: clusterCIDR},
		{Client: c, ClusterCIDR: clusterCIDR},
		{Client: c, NodeName: "n"},
		{Client: c, NodeName: "n", ClusterCIDR: clusterCIDR, MaskSize: 8},
		{Client: c, NodeName: "n", ClusterCIDR: netip.MustParsePrefix("fd00::/32")}, // 2^32 /64s
		{Client: c, NodeName: "n", ClusterCIDR: netip.MustParsePrefix("fd00::/120"), MaskSize: 127},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted", o)
		}
	}
}

// Many nodes claiming at once never share a subnet: the Lease create is the
// arbiter.
func TestConcurrentClaimsAreDistinct(t *testing.T) {
	c := fake.NewClientset()
	const n = 20
	for i := range n {
		addNode(t, c, fmt.Sprintf("n%d", i), "")
	}
	var wg sync.WaitGroup
	got := make([]netip.Prefix, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			got[i], errs[i] = Ensure(context.Background(), Options{Client: c, NodeName: fmt.Sprintf("n%d", i), ClusterCIDR: clusterCIDR})
		})
	}
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("node n%d: %v", i, errs[i])
		}
		if j, dup := seen[got[i]]; dup {
			t.Errorf("nodes n%d and n%d both got %v", j, i, got[i])
		}
		seen[got[i]] = i
		if s := nodeCIDR(t, c, fmt.Sprintf("n%d", i)); s != got[i].String() {
			t.Errorf("node n%d: spec.podCIDR %q, Ensure said %v", i, s, got[i])
		}
	}
}

// An IPv6 cluster CIDR hands out /64s (kube-controller-manager's default
// for the family), counted in the 128-bit address.
func TestClaimsIPv6Subnet(t *testing.T) {
	c := fake.NewClientset()
	addNode(t, c, "n0", "fd00:244::/64")
	addNode(t, c, "new", "")
	got, err := Ensure(context.Background(), Options{Client: c, NodeName: "new", ClusterCIDR: netip.MustParsePrefix("fd00:244::/56")})
	if err != nil || got.String() != "fd00:244:0:1::/64" {
		t.Fatalf("Ensure = %v, %v; want fd00:244:0:1::/64", got, err)
	}
	if s := nodeCIDR(t, c, "new"); s != "fd00:244:0:1::/64" {
		t.Errorf("Node.spec.podCIDR = %q", s)
	}
	if _, err := c.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), LeaseName(got), metav1.GetOptions{}); err != nil {
		t.Errorf("claim Lease: %v", err)
	}
}

// TestClaimsOnePerFamily: a dual-stack node claims a subnet of each
// cluster CIDR, each with its own Lease, and writes both into its Node in
// one patch (podCIDR the first); a call after that (a restart) finds
// them, and the next node gets the next subnet of each family.
func TestClaimsOnePerFamily(t *testing.T) {
	c := fake.NewClientset()
	addNode(t, c, "n1", "")
	addNode(t, c, "n2", "")
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")
	opts := func(node string) []Options {
		return []Options{{Client: c, NodeName: node, ClusterCIDR: v4}, {Client: c, NodeName: node, ClusterCIDR: v6}}
	}
	ctx := context.Background()
	got, err := EnsureAll(ctx, opts("n1"))
	if err != nil || fmt.Sprint(got) != "[10.244.0.0/24 fd00:10:244::/64]" {
		t.Fatalf("EnsureAll = %v, %v; want [10.244.0.0/24 fd00:10:244::/64]", got, err)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || n.Spec.PodCIDR != "10.244.0.0/24" || fmt.Sprint(n.Spec.PodCIDRs) != "[10.244.0.0/24 fd00:10:244::/64]" {
		t.Errorf("Node.spec: podCIDR %q podCIDRs %v (%v)", n.Spec.PodCIDR, n.Spec.PodCIDRs, err)
	}
	for _, p := range got {
		if _, err := c.CoordinationV1().Leases(DefaultNamespace).Get(ctx, LeaseName(p), metav1.GetOptions{}); err != nil {
			t.Errorf("claim Lease of %v: %v", p, err)
		}
	}
	if again, err := EnsureAll(ctx, opts("n1")); err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
		t.Errorf("again: %v, %v", again, err)
	}
	if p6, err := Ensure(ctx, Options{Client: c, NodeName: "n1", ClusterCIDR: v6}); err != nil || p6 != got[1] {
		t.Errorf("Ensure of the IPv6 family alone: %v, %v; want %v", p6, err, got[1])
	}
	if got2, err := EnsureAll(ctx, opts("n2")); err != nil || fmt.Sprint(got2) != "[10.244.1.0/24 fd00:10:244:1::/64]" {
		t.Errorf("second node: %v, %v", got2, err)
	}
	if _, err := EnsureAll(ctx, []Options{{Client: c, NodeName: "n2", ClusterCIDR: v4}, {Client: c, NodeName: "n2", ClusterCIDR: netip.MustParsePrefix("10.245.0.0/16")}}); err == nil || !strings.Contains(err.Error(), "two IPv4 cluster CIDRs") {
		t.Errorf("two IPv4 cluster CIDRs: %v", err)
	}
}
