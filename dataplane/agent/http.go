package agent

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/status"
)

// endpoints are proxyd's HTTP endpoints beside its health port (served by
// the daemon skeleton, HealthEndpoint), as kube-proxy's: on the metrics
// port (10249) /metrics, /healthz and /proxyMode, and podnet's /status.
func endpoints(o Options, reg *prometheus.Registry, p *health.Progress, board *status.Board) []app.Endpoint {
	mode := "none"
	if o.ServiceProxy != nil {
		mode = o.ServiceProxy.Mode.Name
	}
	proxyMode := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, mode)
	})
	return []app.Endpoint{
		{Name: "metrics", Addr: o.MetricsAddr, Flag: "--metrics-bind-address", Path: "/metrics", Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})},
		{Name: "metrics", Addr: o.MetricsAddr, Flag: "--metrics-bind-address", Path: "/healthz", Handler: p.Healthz()},
		{Name: "metrics", Addr: o.MetricsAddr, Flag: "--metrics-bind-address", Path: "/proxyMode", Handler: proxyMode},
		{Name: "metrics", Addr: o.MetricsAddr, Flag: "--metrics-bind-address", Path: status.Path, Handler: board},
	}
}

// followNodeLeaving makes /healthz fail while this node is being deleted or
// drained (its Node says so), as kube-proxy's does, so load balancers move
// away; /livez is not affected.
func followNodeLeaving(store *cluster.Store, nodeName string, p *health.Progress) {
	store.Subscribe(func(ev cluster.Event) {
		if ev.Kind != cluster.KindNode || ev.Key.Name != nodeName {
			return
		}
		n, _ := ev.New.(*cluster.Node)
		p.SetNodeLeaving(n == nil || n.Leaving) // deleted: leaving for good
	})
}
