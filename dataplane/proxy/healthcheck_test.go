package proxy

import (
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

func TestHealthChecks(t *testing.T) {
	addrs := make(map[uint16]string)
	h := &HealthChecks{Listen: func(port uint16) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			addrs[port] = ln.Addr().String()
		}
		return ln, err
	}}
	defer h.Close()
	svc := service(func(s *cluster.Service) {
		s.Type, s.ExternalTrafficPolicyLocal, s.HealthCheckNodePort = cluster.ServiceTypeLoadBalancer, true, 32000
	})
	key := svc.Key()
	me := NodeInfo{Name: "n1"}
	// ports builds the Service's ports with endpoints of the given
	// conditions, each "node/state" (ready or terminating, still serving).
	ports := func(eps ...string) map[cluster.Key][]*ServicePort {
		es := &cluster.EndpointSlice{Namespace: "ns", Name: "s-1", ServiceName: "s", AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}}
		for i, e := range eps {
			node, state, _ := strings.Cut(e, "/")
			es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)})},
				NodeName: node, Ready: state == "ready", Serving: true, Terminating: state == "terminating"})
		}
		return map[cluster.Key][]*ServicePort{key: BuildServicePorts(svc, []*cluster.EndpointSlice{es}, me, ipfamily.IPv4)}
	}
	if err := h.Sync(ports("n1/ready", "n1/ready", "n2/ready")); err != nil {
		t.Fatal(err)
	}
	get := func() (int, int) {
		resp, err := http.Get("http://" + addrs[32000] + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ LocalEndpoints int }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body.LocalEndpoints
	}
	if code, n := get(); code != 200 || n != 2 {
		t.Errorf("with 2 local endpoints: %d, %d", code, n)
	}
	if err := h.Sync(ports("n1/ready", "n1/terminating")); err != nil {
		t.Fatal(err)
	}
	if code, n := get(); code != 200 || n != 1 {
		t.Errorf("with 1 ready and 1 terminating local endpoint: %d, %d", code, n)
	}
	// The only local endpoint is terminating: it still serves traffic that
	// reaches the node (the serving-terminating fallback), but the node
	// tells load balancers to go elsewhere, as kube-proxy's does.
	only := ports("n1/terminating", "n2/ready")
	if local := only[key][0].LocalEndpoints; len(local) != 1 {
		t.Fatalf("local endpoints %v, want the terminating one as fallback", ips(local))
	}
	if err := h.Sync(only); err != nil {
		t.Fatal(err)
	}
	if code, n := get(); code != 503 || n != 0 {
		t.Errorf("with only a terminating local endpoint: %d, %d", code, n)
	}
	if err := h.Sync(ports("n2/ready")); err != nil {
		t.Fatal(err)
	}
	if code, n := get(); code != 503 || n != 0 {
		t.Errorf("with no local endpoint: %d, %d", code, n)
	}
	if err := h.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addrs[32000] + "/"); err == nil {
		t.Error("server still answers after its Service went away")
	}
}
