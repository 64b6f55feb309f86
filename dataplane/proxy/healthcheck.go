package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/podnet/podnet/dataplane/cluster"
)

// HealthChecks serves the healthCheckNodePort of every Service with
// externalTrafficPolicy Local: 200 with the count of this node's ready
// endpoints when it has one, 503 when it has none, so load balancers skip
// the node. Terminating endpoints do not count, though they may still
// serve (kube-proxy counts them alike): a node whose pods are going away
// is drained.
type HealthChecks struct {
	// Listen opens the listener for a port; nil means TCP on all addresses.
	Listen func(port uint16) (net.Listener, error)

	mu      sync.Mutex
	servers map[uint16]*hcServer
}

type hcServer struct {
	srv     *http.Server
	service cluster.Key
	local   int
}

// Sync starts servers for new ports, stops those no longer wanted and
// updates the counts of the rest.
func (h *HealthChecks) Sync(ports map[cluster.Key][]*ServicePort) error {
	want := make(map[uint16]hcServer)
	for key, sps := range ports {
		for _, sp := range sps {
			if sp.HealthCheckNodePort == 0 {
				continue
			}
			want[sp.HealthCheckNodePort] = hcServer{service: key, local: localReady(sp)}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.servers == nil {
		h.servers = make(map[uint16]*hcServer)
	}
	for port, s := range h.servers {
		if _, ok := want[port]; !ok {
			s.srv.Close()
			delete(h.servers, port)
		}
	}
	var errs []error
	for port, w := range want {
		if s, ok := h.servers[port]; ok {
			s.service, s.local = w.service, w.local
			continue
		}
		listen := h.Listen
		if listen == nil {
			listen = func(p uint16) (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf(":%d", p)) }
		}
		ln, err := listen(port)
		if err != nil {
			errs = append(errs, fmt.Errorf("listen on health check node port %d for %s: %w", port, w.service, err))
			continue
		}
		s := &hcServer{service: w.service, local: w.local}
		s.srv = &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			h.mu.Lock()
			key, n := s.service, s.local
			h.mu.Unlock()
			rw.Header().Set("Content-Type", "application/json")
			rw.Header().Set("X-Content-Type-Options", "nosniff")
			if n == 0 {
				rw.WriteHeader(http.StatusServiceUnavailable)
			}
			json.NewEncoder(rw).Encode(map[string]any{
				"service":        map[string]string{"namespace": key.Namespace, "name": key.Name},
				"localEndpoints": n,
			})
		})}
		h.servers[port] = s
		go s.srv.Serve(ln)
	}
	return errors.Join(errs...)
}

// localReady counts the port's ready, non-terminating endpoints on this
// node: the ones a load balancer may send new traffic to.
func localReady(sp *ServicePort) int {
	n := 0
	for _, e := range sp.Endpoints {
		if e.Local && e.Ready && !e.Terminating {
			n++
		}
	}
	return n
}

// Close stops every server.
func (h *HealthChecks) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		s.srv.Close()
		delete(h.servers, port)
	}
}
