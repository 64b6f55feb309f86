package convert

import (
	"github.com/podnet/podnet/dataplane/cluster"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func ptr[T any](v T) *T { return &v }

func TestFromV1Service(t *testing.T) {
	itp := v1.ServiceInternalTrafficPolicyLocal
	tests := []struct {
		name string
		in   v1.Service
		want *cluster.Service
	}{{
		name: "defaults",
		in: v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: v1.ServiceSpec{
				ClusterIP:       "10.96.0.20",
				Ports:           []v1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}},
				SessionAffinity: v1.ServiceAffinityClientIP,
			},
		},
		want: &cluster.Service{
			Namespace: "default", Name: "web", Type: cluster.ServiceTypeClusterIP,
			ClusterIPs:             []netip.Addr{netip.MustParseAddr("10.96.0.20")},
			Ports:                  []cluster.ServicePort{{Protocol: cluster.TCP, Port: 80, TargetPort: "http"}},
			SessionAffinityTimeout: 10800 * time.Second,
		},
	}, {
		name: "everything",
		in: v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "lb", Labels: map[string]string{cluster.LabelServiceProxyName: "other"}},
			Spec: v1.ServiceSpec{
				Type:                     v1.ServiceTypeLoadBalancer,
				ClusterIP:                "10.96.0.21",
				ClusterIPs:               []string{"10.96.0.21", "fd00::21"},
				ExternalIPs:              []string{"203.0.113.5"},
				LoadBalancerSourceRanges: []string{" 198.51.100.0/24 "},
				Ports: []v1.ServicePort{
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053, TargetPort: intstr.FromInt32(5353)},
				},
				SessionAffinity:          v1.ServiceAffinityClientIP,
				SessionAffinityConfig:    &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}},
				ExternalTrafficPolicy:    v1.ServiceExternalTrafficPolicyLocal,
				InternalTrafficPolicy:    &itp,
				HealthCheckNodePort:      32000,
				TrafficDistribution:      ptr("PreferClose"),
				PublishNotReadyAddresses: true,
			},
			Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "192.0.2.7"}, {Hostname: "lb.example"}}}},
		},
		want: &cluster.Service{
			Namespace: "shop", Name: "lb", Type: cluster.ServiceTypeLoadBalancer,
			ClusterIPs:                 []netip.Addr{netip.MustParseAddr("10.96.0.21"), netip.MustParseAddr("fd00::21")},
			ExternalIPs:                []netip.Addr{netip.MustParseAddr("203.0.113.5")},
			LoadBalancerIPs:            []netip.Addr{netip.MustParseAddr("192.0.2.7")},
			LoadBalancerSourceRanges:   []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			Ports:                      []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53, NodePort: 30053, TargetPort: "5353"}},
			SessionAffinityTimeout:     60 * time.Second,
			ExternalTrafficPolicyLocal: true,
			InternalTrafficPolicyLocal: true,
			HealthCheckNodePort:        32000,
			TrafficDistribution:        "PreferClose",
			PublishNotReadyAddresses:   true,
			ProxyName:                  "other",
		},
	}, {
		name: "headless",
		in:   v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "h"}, Spec: v1.ServiceSpec{ClusterIP: "None", ClusterIPs: []string{"None"}}},
		want: &cluster.Service{Namespace: "a", Name: "h", Type: cluster.ServiceTypeClusterIP, Headless: true},
	}, {
		name: "external name",
		in:   v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x"}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "db.example.com"}},
		want: &cluster.Service{Namespace: "a", Name: "x", Type: cluster.ServiceTypeExternalName, ExternalName: "db.example.com"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromV1Service(&tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestFromV1ServiceBadIP(t *testing.T) {
	_, err := FromV1Service(&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.0.300"}})
	if err == nil {
		t.Fatal("want an error for an invalid clusterIP")
	}
}

func TestFromV1EndpointSlice(t *testing.T) {
	in := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-abc", Labels: map[string]string{cluster.LabelServiceName: "web"},
			Annotations: map[string]string{cluster.AnnotationTriggerTime: "2026-11-23T15:04:05.5Z"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Protocol: ptr(v1.ProtocolUDP), Port: ptr(int32(53))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, NodeName: ptr("node1"), Zone: ptr("z1"), Hostname: ptr("web-0"),
				TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "web-0"},
				Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node1"}}}},
			{Addresses: []string{"10.244.2.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
			{Addresses: []string{"10.244.3.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
			{Addresses: []string{"10.244.4.5"}, TargetRef: &v1.ObjectReference{Kind: "Node", Name: "n"}},
		},
	}
	want := &cluster.EndpointSlice{
		Namespace: "shop", Name: "web-abc", ServiceName: "web", AddressType: "IPv4",
		TriggerTime: time.Date(2026, 11, 23, 15, 4, 5, 5e8, time.UTC),
		Ports:       []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}, {Protocol: cluster.UDP, Port: 53}},
		Endpoints: []cluster.Endpoint{
			{Addresses: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Ready: true, Serving: true, Hostname: "web-0", NodeName: "node1", Zone: "z1",
				Hints: &cluster.Hints{Zones: []string{"z1"}, Nodes: []string{"node1"}}, TargetPod: "web-0"},
			{Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.5")}},
			{Addresses: []netip.Addr{netip.MustParseAddr("10.244.3.5")}, Serving: true, Terminating: true},
			{Addresses: []netip.Addr{netip.MustParseAddr("10.244.4.5")}, Ready: true, Serving: true},
		},
	}
	got, err := FromV1EndpointSlice(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// Slices labelled service.kubernetes.io/headless or
// service.kubernetes.io/service-proxy-name (any value, even empty) are
// marked for the Service proxies to leave out; others are not.
func TestFromV1EndpointSliceNotProxied(t *testing.T) {
	for labels, want := range map[string]bool{
		"":                                   false,
		cluster.LabelHeadless:                true,
		cluster.LabelServiceProxyName:        true,
		cluster.LabelHeadless + ",other=yes": true,
	} {
		l := map[string]string{cluster.LabelServiceName: "web"}
		for _, k := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(k, "="); k != "" {
				l[k] = map[bool]string{true: v, false: ""}[ok]
			}
		}
		for _, at := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
			got, err := FromV1EndpointSlice(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Labels: l}, AddressType: at})
			if err != nil {
				t.Fatal(err)
			}
			if got.NotProxied != want {
				t.Errorf("labels %v, %s: NotProxied %v, want %v", l, at, got.NotProxied, want)
			}
		}
	}
}

func TestFromV1NodeAndPod(t *testing.T) {
	n, err := FromV1Node(&v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{cluster.LabelZone: "z1"}},
		Spec:       v1.NodeSpec{PodCIDR: "10.244.1.0/24"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeHostName, Address: "node1"},
			{Type: v1.NodeInternalIP, Address: "192.168.10.11"},
			{Type: v1.NodeExternalIP, Address: "203.0.113.11"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantNode := &cluster.Node{
		Name: "node1", Zone: "z1", Labels: map[string]string{cluster.LabelZone: "z1"},
		PodCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		InternalIPs: []netip.Addr{netip.MustParseAddr("192.168.10.11")},
		ExternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.11")},
	}
	if !reflect.DeepEqual(n, wantNode) {
		t.Errorf("node: got %+v, want %+v", n, wantNode)
	}
	for _, leaving := range []*v1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "d", DeletionTimestamp: &metav1.Time{}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: cluster.TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}}},
	} {
		if n, err := FromV1Node(leaving); err != nil || !n.Leaving {
			t.Errorf("node %s: Leaving %v (%v), want true", leaving.Name, n.Leaving, err)
		}
	}
	p, err := FromV1Pod(&v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       v1.PodSpec{Hostname: "h", Subdomain: "s", NodeName: "node1"},
		Status:     v1.PodStatus{PodIP: "10.244.1.9", PodIPs: []v1.PodIP{{IP: "10.244.1.9"}, {IP: "fd00::9"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantPod := &cluster.Pod{Namespace: "default", Name: "p", Hostname: "h", Subdomain: "s", NodeName: "node1",
		IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00::9")}}
	if !reflect.DeepEqual(p, wantPod) {
		t.Errorf("pod: got %+v, want %+v", p, wantPod)
	}
}

// TestEndpointSliceSharesStrings: the strings repeated across slices (the
// namespace, node names, zones) are one copy whatever copies the decoder
// made, and a slice's endpoint addresses share one array; a bad address
// still names its endpoint.
func TestEndpointSliceSharesStrings(t *testing.T) {
	slice := func(name string) *discoveryv1.EndpointSlice {
		node := string([]byte("node-a")) // a fresh copy, as a decoder makes
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: string([]byte("ns"))},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.1.2"}, NodeName: &node, Zone: ptr(string([]byte("z1")))},
				{Addresses: []string{"10.244.1.3", "10.244.1.4"}, NodeName: &node},
			},
		}
	}
	a, err := FromV1EndpointSlice(slice("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromV1EndpointSlice(slice("b"))
	if err != nil {
		t.Fatal(err)
	}
	same := func(what, x, y string) {
		if x != y || unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q and %q are separate copies", what, x, y)
		}
	}
	same("namespace", a.Namespace, b.Namespace)
	same("nodeName", a.Endpoints[0].NodeName, b.Endpoints[1].NodeName)
	same("zone", a.Endpoints[0].Zone, b.Endpoints[0].Zone)
	e0, e1 := a.Endpoints[0].Addresses, a.Endpoints[1].Addresses
	if len(e0) != 1 || len(e1) != 2 || cap(e0) != 1 ||
		uintptr(unsafe.Pointer(&e1[0]))-uintptr(unsafe.Pointer(&e0[0])) != unsafe.Sizeof(e0[0]) {
		t.Errorf("addresses %v and %v: want one array, each endpoint's capacity cut to its own", e0, e1)
	}
	bad := slice("c")
	bad.Endpoints[1].Addresses[1] = "10.244.1.x"
	if _, err := FromV1EndpointSlice(bad); err == nil || !strings.Contains(err.Error(), "endpoints[1].addresses") {
		t.Errorf("bad address: err = %v, want one naming endpoints[1].addresses", err)
	}
}
