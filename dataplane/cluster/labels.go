package cluster

import "time"

// Well-known labels the dataplane reads.
const (
	LabelZone             = "topology.kubernetes.io/zone"
	LabelServiceName      = "kubernetes.io/service-name"
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
)

// DefaultSessionAffinityTimeout is the API default for
// sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultSessionAffinityTimeout = 10800 * time.Second
