package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/kubeproxy"
	"github.com/podnet/podnet/dataplane/proxy"
)

// migration is the part of proxyd's command line that adopts a running
// cluster (README: "Migrating from flannel, kube-proxy and CoreDNS").
type migration struct {
	podNetwork string
	takeOver   bool
	flannel    bool
}

func (m *migration) register(fs *pflag.FlagSet) {
	fs.StringVar(&m.podNetwork, "pod-network", "podnet", "who runs the pod network: podnet, or none while another network (flannel) still does (proxyd then programs only the Services: no routes, VXLAN device, node config or masquerade)")
	fs.BoolVar(&m.flannel, "flannel-annotations", false, "write flannel's Node annotations (backend vxlan, VTEP MAC, public IP) for this node, so nodes still running flannel reach its pods while the cluster migrates; other nodes' annotations are always read")
	fs.BoolVar(&m.takeOver, "take-over-from-kube-proxy", false, "once proxyd's own Service rules are in place, remove kube-proxy's as kube-proxy --cleanup would: its iptables KUBE-* chains (kubelet's canaries stay), its nftables tables, its IPVS device, virtual servers and ipsets")
}

// apply puts the migration flags into the agent's options and its Service
// proxy's.
func (m *migration) apply(o *agent.Options, sp *proxy.ServiceOptions, logger *slog.Logger) error {
	switch m.podNetwork {
	case "podnet":
	case "none":
		o.NoPodNetwork = true
	default:
		return fmt.Errorf("--pod-network: %q is not podnet or none", m.podNetwork)
	}
	if m.flannel && o.NoPodNetwork {
		return fmt.Errorf("--flannel-annotations: with --pod-network none flannel still runs this node and writes its own")
	}
	o.FlannelAnnotations = m.flannel
	if !m.takeOver {
		return nil
	}
	if sp.Mode.Name == proxy.None.Name {
		return fmt.Errorf("--take-over-from-kube-proxy: with --proxy-mode %s nothing would serve the Services", sp.Mode.Name)
	}
	sp.TakeOver = func() error {
		rep, err := kubeproxy.Cleanup(kubeproxy.Options{})
		if !rep.Empty() {
			logger.Info("kube-proxy's state removed", "chains", len(rep.Chains), "nftables", rep.NFTTables, "links", rep.Links, "ipvs", rep.IPVS, "ipsets", rep.IPSets)
		}
		return err
	}
	return nil
}
