package proxy

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
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
	key := cluster.Key{Namespace: "ns", Name: "web"}
	sp := &ServicePort{HealthCheckNodePort: 32000, LocalEndpoints: []Endpoint{{}, {}}}
	if err := h.Sync(map[cluster.Key][]*ServicePort{key: {sp}}); err != nil {
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
	none := &ServicePort{HealthCheckNodePort: 32000}
	if err := h.Sync(map[cluster.Key][]*ServicePort{key: {none}}); err != nil {
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
