package statedir

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// LimitFlags are kube-apiserver's two flags that decide which Services a
// state directory may hold; proxyd and dnsd both take them, so both refuse
// the same objects.
type LimitFlags struct {
	serviceCIDRs, nodePorts string
}

// Register adds --service-cluster-ip-range and --service-node-port-range.
func (f *LimitFlags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.serviceCIDRs, "service-cluster-ip-range", convert.DefaultServiceCIDR.String(),
		"the Service IP range (one CIDR per family, comma-separated); state-directory Services with cluster IPs outside it are refused, as kube-apiserver would")
	fs.StringVar(&f.nodePorts, "service-node-port-range", convert.DefaultNodePorts.String(),
		"the NodePort range; state-directory Services with nodePorts outside it are refused, as kube-apiserver would")
}

// Limits returns the parsed flags.
func (f *LimitFlags) Limits() (convert.Limits, error) {
	var l convert.Limits
	var err error
	if l.ServiceCIDRs, err = convert.ParseServiceCIDRs(f.serviceCIDRs); err != nil {
		return l, fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	if l.NodePorts, err = convert.ParsePortRange(f.nodePorts); err != nil {
		return l, fmt.Errorf("--service-node-port-range: %w", err)
	}
	return l, nil
}
