package e2e

import (
	"context"
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/e2e/apiserver"
)

// TestSeedServicesAsCreated checks that Services seeded into etcd
// (apiserver.SeedServices, what the benchmarks at 10,000 Services use) are
// what the API server stores when CreateServices creates them through it:
// the same Service and EndpointSlice apart from names, identities and the
// cluster IP; an IPAddress holding each seeded cluster IP for its Service;
// and the API server's allocator refusing that IP to another Service.
func TestSeedServicesAsCreated(t *testing.T) {
	_, srv := kubeAPI(t)
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const n, m = 3, 2
	if err := apiserver.CreateServices(ctx, admin, "seed-api", n, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteSeedServices(t, admin, "seed-api", n) })
	if err := srv.SeedServices(ctx, admin, "seed-etcd", n, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteSeedServices(t, admin, "seed-etcd", n) })
	for i := range n {
		name := apiserver.ServiceName(i)
		api, err := admin.CoreV1().Services("seed-api").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seeded, err := admin.CoreV1().Services("seed-etcd").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip := seeded.Spec.ClusterIP
		if want, _ := apiserver.SeedClusterIP(netip.MustParsePrefix(apiserver.ServiceCIDR), i); ip != want.String() || len(seeded.Spec.ClusterIPs) != 1 || seeded.Spec.ClusterIPs[0] != ip {
			t.Errorf("%s: seeded cluster IPs %v, want [%s]", name, seeded.Spec.ClusterIPs, want)
		}
		api.Spec.ClusterIP, api.Spec.ClusterIPs = ip, []string{ip}
		if a, s := storedJSON(t, api), storedJSON(t, seeded); a != s {
			t.Errorf("%s: seeded Service\n%s\nwant (as created through the API)\n%s", name, s, a)
		}
		apiSlice, err := admin.DiscoveryV1().EndpointSlices("seed-api").Get(ctx, name+"-abcde", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seededSlice, err := admin.DiscoveryV1().EndpointSlices("seed-etcd").Get(ctx, name+"-abcde", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a, s := storedJSON(t, apiSlice), storedJSON(t, seededSlice); a != s {
			t.Errorf("%s: seeded EndpointSlice\n%s\nwant\n%s", name, s, a)
		}
		addr, err := admin.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the IPAddress of its cluster IP: %v", name, err)
		}
		if ref := addr.Spec.ParentRef; ref == nil || ref.Resource != "services" || ref.Namespace != "seed-etcd" || ref.Name != name {
			t.Errorf("IPAddress %s: parent %+v, want Service seed-etcd/%s", ip, ref, name)
		}
	}
	// The seeded IP is the Service's: another Service asking for it is
	// refused.
	taken, _ := apiserver.SeedClusterIP(netip.MustParsePrefix(apiserver.ServiceCIDR), 0)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "wants-a-seeded-ip"},
		Spec: corev1.ServiceSpec{ClusterIP: taken.String(), Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := admin.CoreV1().Services("seed-api").Create(ctx, svc, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "already allocated") {
		t.Errorf("a Service asking for seeded cluster IP %s: %v, want it refused as already allocated", taken, err)
		_ = admin.CoreV1().Services("seed-api").Delete(ctx, svc.Name, metav1.DeleteOptions{})
	}
	// The allocator's informer holds every IPAddress the API server lists,
	// the seeded ones too: its allocated_ips gauge, set from that informer
	// when it allocates, counts them.
	checkAllocatorSeesIPAddresses(t, admin)
}

// checkAllocatorSeesIPAddresses creates a Service with a dynamic cluster
// IP and compares the allocator's kube_apiserver_clusterip_allocator_
// allocated_ips with the IPAddresses the API lists (the new one may not be
// in the informer yet when the gauge is set).
func checkAllocatorSeesIPAddresses(t *testing.T, admin kubernetes.Interface) {
	ctx := t.Context()
	probe := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe-allocator"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := admin.CoreV1().Services("seed-api").Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Services("seed-api").Delete(context.Background(), probe.Name, metav1.DeleteOptions{})
	})
	body, err := admin.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gauge := -1
	for l := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(l, `kube_apiserver_clusterip_allocator_allocated_ips{cidr="`+apiserver.ServiceCIDR+`"} `); ok {
			gauge, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	addrs, err := admin.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(addrs.Items); gauge < n-1 || gauge > n {
		t.Errorf("the allocator counts %d allocated IPs, the API lists %d IPAddresses", gauge, n)
	}
}

// storedJSON is obj without what differs between two objects of one
// generator: identity, versions, times, managed fields, namespace.
func storedJSON(t *testing.T, obj metav1.Object) string {
	t.Helper()
	obj.SetUID("")
	obj.SetResourceVersion("")
	obj.SetCreationTimestamp(metav1.Time{})
	obj.SetManagedFields(nil)
	obj.SetNamespace("")
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer(`"namespace":"seed-api"`, `"namespace":"NS"`, `"namespace":"seed-etcd"`, `"namespace":"NS"`).Replace(string(b))
}

// deleteSeedServices deletes the Services and EndpointSlices of ns (no
// namespace controller runs to do it), so that later tests' proxies on the
// shared API server do not see them.
func deleteSeedServices(t *testing.T, admin kubernetes.Interface, ns string, n int) {
	ctx := context.Background()
	for i := range n {
		name := apiserver.ServiceName(i)
		if err := admin.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete service %s/%s: %v", ns, name, err)
		}
		if err := admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name+"-abcde", metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete endpointslice %s/%s: %v", ns, name, err)
		}
	}
}
