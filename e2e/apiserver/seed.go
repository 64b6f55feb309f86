package apiserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
)

// SeedServices makes the API server hold what CreateServices creates
// through it (namespace ns, n ClusterIP Services, one EndpointSlice of m
// endpoints each), but writes the Services, their slices and the
// IPAddress objects that record their cluster IPs straight into etcd, an
// object a transaction as the API server writes them (clients take a
// resourceVersion for one object's change: an informer watching the
// IPAddresses missed ~1 % of them when 128 shared one), 16 at a time, then
// waits until the API server serves them all.
// The objects are the ones the API server stores for CreateServices'
// requests, defaults filled in (TestSeedServicesAsCreated compares them);
// the cluster IPs are the service range's (ServiceCIDR) from 10.97.0.1 on,
// written only where no IPAddress exists yet.
//
// Why not through the API: kube-apiserver v1.36.3's ClusterIP allocator
// counts the IPAddress objects in its informer twice for every address it
// allocates (Allocator.Used and Free, called from createIPAddress for its
// metrics), so a Service's create costs O(Services) and n creates O(n²):
// 48 % of the API server's CPU at 1,200 Services, 71 % at 6,000 (pprof),
// and creating 10,000 took 6.5 min at load 15 and did not end within 14
// at load 24–43. Seeding 10,000 takes seconds.
func (s *Server) SeedServices(ctx context.Context, client kubernetes.Interface, ns string, n, m int) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	etcd := &http.Client{Transport: &http.Transport{DialContext: dialIn(s.o.NSPath)}, Timeout: time.Minute}
	defer etcd.CloseIdleConnections()
	seed := seeder{cidr: netip.MustParsePrefix(ServiceCIDR), ns: ns, m: m, created: metav1.Now()}
	// The IPAddresses first: the API server's repair loop, seeing a Service
	// whose cluster IP has no IPAddress yet, would create one.
	var addrs, objs []etcdKV
	for i := range n {
		addr, rest, err := seed.objects(i)
		if err != nil {
			return err
		}
		addrs, objs = append(addrs, addr), append(objs, rest...)
	}
	for _, kvs := range [][]etcdKV{addrs, objs} {
		if err := etcdPutAll(ctx, etcd, kvs); err != nil {
			return fmt.Errorf("seed %d Services in %s: %w", n, ns, err)
		}
		if err := waitServed(ctx, client, ns, n, len(kvs) == len(addrs)); err != nil {
			return err
		}
	}
	return nil
}

// seeder builds the stored objects of one namespace's Services.
type seeder struct {
	cidr    netip.Prefix
	ns      string
	m       int
	created metav1.Time
}

// SeedClusterIP is the cluster IP SeedServices gives its i-th Service in
// the service range prefix: 2^16 + i + 1 addresses into it (10.97.0.1 on
// in 10.96.0.0/12), away from the range's first 256, which the allocator
// keeps for static addresses. IPv4 and IPv6 alike.
func SeedClusterIP(prefix netip.Prefix, i int) (netip.Addr, error) {
	a, ok := addrAdd(prefix.Masked().Addr(), uint64(1<<16+i+1))
	if !ok || !prefix.Contains(a) {
		return netip.Addr{}, fmt.Errorf("seed cluster IP %d: outside %s", i, prefix)
	}
	return a, nil
}

// addrAdd returns a + off, and false past the family's last address.
func addrAdd(a netip.Addr, off uint64) (netip.Addr, bool) {
	b := a.As16()
	for i := 15; i >= 0 && off > 0; i-- {
		sum := uint64(b[i]) + off&0xff
		b[i] = byte(sum)
		off = off>>8 + sum>>8
	}
	r := netip.AddrFrom16(b)
	if a.Is4() {
		if !r.Unmap().Is4() {
			return netip.Addr{}, false
		}
		r = r.Unmap()
	}
	return r, off == 0
}

// objects are Service i's three objects as the API server stores them:
// the IPAddress of its cluster IP, then the Service and its EndpointSlice.
func (s seeder) objects(i int) (etcdKV, []etcdKV, error) {
	ip, err := SeedClusterIP(s.cidr, i)
	if err != nil {
		return etcdKV{}, nil, err
	}
	family := corev1.IPv4Protocol
	if ip.Is6() {
		family = corev1.IPv6Protocol
	}
	svc := serviceObject(s.ns, i)
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	s.meta(&svc.ObjectMeta)
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip.String(), []string{ip.String()}
	svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = []corev1.IPFamily{family}, new(corev1.IPFamilyPolicySingleStack)
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	svc.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyCluster)

	addr := &networkingv1.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), Labels: map[string]string{
			networkingv1.LabelIPAddressFamily: string(family),
			networkingv1.LabelManagedBy:       "ipallocator.k8s.io",
		}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: s.ns, Name: svc.Name}},
	}
	s.meta(&addr.ObjectMeta)

	slice := sliceObject(s.ns, i, s.m)
	slice.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	s.meta(&slice.ObjectMeta)
	slice.Generation = 1
	if family == corev1.IPv6Protocol {
		sliceTo6(slice)
	}

	var kvs []etcdKV
	for _, o := range []struct {
		key string
		obj runtime.Object
	}{
		{"/registry/ipaddresses/" + addr.Name, addr},
		{"/registry/services/specs/" + s.ns + "/" + svc.Name, svc},
		{"/registry/endpointslices/" + s.ns + "/" + slice.Name, slice},
	} {
		v, err := json.Marshal(o.obj)
		if err != nil {
			return etcdKV{}, nil, err
		}
		kvs = append(kvs, etcdKV{o.key, v})
	}
	return kvs[0], kvs[1:], nil
}

// sliceTo6 moves slice's IPv4 endpoints into fd00:10:244::/96, one for
// one, for a Service of an IPv6 range.
func sliceTo6(slice *discoveryv1.EndpointSlice) {
	slice.AddressType = discoveryv1.AddressTypeIPv6
	for i, e := range slice.Endpoints {
		for j, a := range e.Addresses {
			v4 := netip.MustParseAddr(a).As4()
			slice.Endpoints[i].Addresses[j] = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44, 12: v4[0], v4[1], v4[2], v4[3]}).String()
		}
	}
}

func (s seeder) meta(m *metav1.ObjectMeta) {
	m.UID = uuid.NewUUID()
	m.CreationTimestamp = s.created
}

type etcdKV struct {
	key   string
	value []byte
}

// etcdPutAll writes each of kvs in a transaction of its own, 16 at a time.
func etcdPutAll(ctx context.Context, c *http.Client, kvs []etcdKV) error {
	var next atomic.Int64
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(kvs) && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				if errs[w] = etcdPutNew(ctx, c, kvs[i]); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// etcdPutNew writes kv through etcd's JSON gateway if its key does not
// exist yet.
func etcdPutNew(ctx context.Context, c *http.Client, kv etcdKV) error {
	type compare struct {
		Key            string `json:"key"`
		Target         string `json:"target"`
		Result         string `json:"result"`
		CreateRevision string `json:"create_revision"`
	}
	type put struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type op struct {
		RequestPut put `json:"request_put"`
	}
	var txn struct {
		Compare []compare `json:"compare"`
		Success []op      `json:"success"`
	}
	b64 := base64.StdEncoding.EncodeToString
	txn.Compare = []compare{{Key: b64([]byte(kv.key)), Target: "CREATE", Result: "EQUAL", CreateRevision: "0"}}
	txn.Success = []op{{put{Key: b64([]byte(kv.key)), Value: b64(kv.value)}}}
	body, err := json.Marshal(txn)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:2379/v3/kv/txn", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("etcd txn: %w", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("etcd txn: %w", err)
	}
	var res struct {
		Succeeded bool `json:"succeeded"`
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd txn: %s: %s", resp.Status, out)
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("etcd txn: %w: %s", err, out)
	}
	if !res.Succeeded {
		return fmt.Errorf("etcd: %s exists already (a cluster IP taken, or the objects seeded before)", kv.key)
	}
	return nil
}

// waitServed waits until the API server lists the seeded IPAddresses
// (addrs), or n Services and n EndpointSlices in ns: its watch cache has
// read them from etcd.
func waitServed(ctx context.Context, client kubernetes.Interface, ns string, n int, addrs bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		got, what, err := seededServed(ctx, client, ns, addrs)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server serves %d %s of %d seeded: %w", got, what, n, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// seededServed counts the seeded objects the API server lists: the
// IPAddresses whose parent is a Service in ns, or the Services of ns that
// have their EndpointSlice too.
func seededServed(ctx context.Context, client kubernetes.Interface, ns string, addrs bool) (int, string, error) {
	if addrs {
		l, err := client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, "", fmt.Errorf("list seeded ipaddresses: %w", err)
		}
		got := 0
		for _, a := range l.Items {
			if ref := a.Spec.ParentRef; ref != nil && ref.Resource == "services" && ref.Namespace == ns {
				got++
			}
		}
		return got, "IPAddresses", nil
	}
	svcs, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("list seeded services: %w", err)
	}
	eps, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("list seeded endpointslices: %w", err)
	}
	return min(len(svcs.Items), len(eps.Items)), "Services with their EndpointSlices", nil
}
