//go:build conformance

package e2e

// The dual-stack lab kinds of make conformance (make conformance-dualstack
// runs e2e.test's [Feature:IPv6DualStack] specs on both): the podnet and
// baseline labs as a dual-stack cluster (realClusterOptions.dualStack,
// IPv4 first), podnet with both cluster CIDRs, the baseline's kube-proxy
// with both (clusterCIDR) and CoreDNS as it is.
func init() {
	confLabs["podnet-dualstack"] = confLab{column: "podnet dual-stack", options: dualStackLab("podnet")}
	confLabs["baseline-dualstack"] = confLab{column: "kube-proxy+CoreDNS dual-stack", options: dualStackLab("baseline")}
}

// dualStackLab is the lab kind named kind, dual-stack.
func dualStackLab(kind string) func(e confLabEnv) realClusterOptions {
	return func(e confLabEnv) realClusterOptions {
		o := confLabs[kind].options(e)
		o.dualStack = true
		return o
	}
}
