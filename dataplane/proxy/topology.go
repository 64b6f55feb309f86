package proxy

import "slices"

// categorize fills ClusterEndpoints, LocalEndpoints and HasEndpoints the way
// kube-proxy does: ready endpoints, or serving-and-terminating ones when none
// is ready; topology narrows the cluster set when it can.
func categorize(sp *ServicePort, trafficDistribution string, node NodeInfo) {
	if sp.usesClusterEndpoints() {
		categorizeCluster(sp, trafficDistribution, node)
	}
	if sp.usesLocalEndpoints() {
		categorizeLocal(sp)
	}
}

// categorizeCluster picks the endpoints any traffic may use.
func categorizeCluster(sp *ServicePort, trafficDistribution string, node NodeInfo) {
	inTopology := topologyFilter(sp.Endpoints, trafficDistribution, node)
	sp.ClusterEndpoints = filter(sp.Endpoints, func(e Endpoint) bool { return e.Ready && inTopology(e) })
	if len(sp.ClusterEndpoints) == 0 {
		sp.ClusterEndpoints = filter(sp.Endpoints, func(e Endpoint) bool {
			return e.Serving && e.Terminating && inTopology(e)
		})
	}
	sp.HasEndpoints = len(sp.ClusterEndpoints) > 0
}

// categorizeLocal picks the endpoints on this node, for a Local traffic
// policy.
func categorizeLocal(sp *ServicePort) {
	var localReady, localTerminating bool
	for _, e := range sp.Endpoints {
		if e.Ready || e.Serving && e.Terminating {
			sp.HasEndpoints = true
		}
		localReady = localReady || e.Local && e.Ready
		localTerminating = localTerminating || e.Local && e.Serving && e.Terminating
	}
	switch {
	case localReady:
		sp.LocalEndpoints = filter(sp.Endpoints, func(e Endpoint) bool { return e.Local && e.Ready })
	case localTerminating:
		sp.LocalEndpoints = filter(sp.Endpoints, func(e Endpoint) bool { return e.Local && e.Serving && e.Terminating })
	}
}

// topologyFilter returns which endpoints topology allows for this node.
// EndpointSlice hints win when every ready endpoint carries them (what the
// EndpointSlice controller writes for trafficDistribution); without hints
// trafficDistribution is applied directly to the endpoints' node and zone,
// so a state directory without a controller behaves the same. Topology is
// ignored when it would leave no ready endpoint.
func topologyFilter(eps []Endpoint, trafficDistribution string, node NodeInfo) func(Endpoint) bool {
	if f, hinted := hintFilter(eps, node); hinted {
		return f
	}
	return distributionFilter(eps, trafficDistribution, node)
}

// anyEndpoint allows every endpoint.
func anyEndpoint(Endpoint) bool { return true }

// hintFilter applies the EndpointSlice hints; hinted is false when no ready
// endpoint carries them.
func hintFilter(eps []Endpoint, node NodeInfo) (f func(Endpoint) bool, hinted bool) {
	allNodeHints, allZoneHints, anyReady := true, true, false
	forNode, forZone := false, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		anyReady = true
		if len(e.Hints().ForNodes()) == 0 {
			allNodeHints = false
		} else if slices.Contains(e.Hints().ForNodes(), node.Name) {
			forNode = true
		}
		if len(e.Hints().ForZones()) == 0 {
			allZoneHints = false
		} else if slices.Contains(e.Hints().ForZones(), node.Zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return anyEndpoint, true
	case allNodeHints && forNode:
		return func(e Endpoint) bool { return slices.Contains(e.Hints().ForNodes(), node.Name) }, true
	case allZoneHints && forZone:
		return func(e Endpoint) bool { return slices.Contains(e.Hints().ForZones(), node.Zone) }, true
	}
	return anyEndpoint, allNodeHints || allZoneHints
}

// distributionFilter applies trafficDistribution to the endpoints' node
// and zone.
func distributionFilter(eps []Endpoint, trafficDistribution string, node NodeInfo) func(Endpoint) bool {
	sameNode := func(e Endpoint) bool { return e.Local }
	sameZone := func(e Endpoint) bool { return node.Zone != "" && e.Zone() == node.Zone }
	hasReady := func(f func(Endpoint) bool) bool {
		return slices.ContainsFunc(eps, func(e Endpoint) bool { return e.Ready && f(e) })
	}
	switch trafficDistribution {
	case "PreferSameNode":
		if hasReady(sameNode) {
			return sameNode
		}
		if hasReady(sameZone) {
			return sameZone
		}
	case "PreferSameZone", "PreferClose":
		if hasReady(sameZone) {
			return sameZone
		}
	}
	return anyEndpoint
}

// filter returns the endpoints keep accepts. When it accepts them all it
// returns eps itself (capacity cut, so an append copies): a built ServicePort is
// never changed, so its lists may share one array, and at 10,000 Services
// the copy was 14.5 MiB of proxyd's live heap.
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
