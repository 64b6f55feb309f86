package cluster

import "time"

// Well-known labels the dataplane reads.
const (
	LabelZone             = "topology.kubernetes.io/zone"
	LabelServiceName      = "kubernetes.io/service-name"
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// TaintToBeDeleted is the taint the cluster autoscaler puts on a node it is
// about to remove.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// AnnotationTriggerTime is the EndpointSlice annotation the endpoint slice
// controller sets to the time of the change that caused an update.
const AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"

// DefaultSessionAffinityTimeout is the API default for
// sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultSessionAffinityTimeout = 10800 * time.Second
