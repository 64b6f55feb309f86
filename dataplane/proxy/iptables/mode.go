package iptables

import (
	"errors"
	"fmt"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Mode is the iptables proxy mode: one iptables-restore per sync into the
// backend (nft or legacy) the node uses (ipt.NodeBackend, the node
// firewall's too).
var Mode = proxy.Mode{
	Name: "iptables",
	Probe: func(cfg proxy.Config) error {
		return runner(cfg).Available()
	},
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		r := runner(cfg)
		cfg.Logger.Info("service proxy: iptables mode", "backend", r.Backend, "family", cfg.Family)
		return NewProxier(Config{
			Family:            cfg.Family,
			ClusterCIDR:       cfg.ClusterCIDR,
			NodePortAddresses: cfg.NodePortAddresses,
			MasqueradeAll:     cfg.MasqueradeAll,
		}, r), nil
	},
	Cleanup: cleanupBackends,
	Hooks:   hooks(),
}

func init() { proxy.Register(Mode) }

func runner(cfg proxy.Config) ipt.Runner {
	return ipt.Runner{Backend: ipt.NodeBackend(), Family: cfg.Family}
}

// hooks are Jumps as the node firewall sees them.
func hooks() []proxy.Hook {
	out := make([]proxy.Hook, len(Jumps))
	for i, j := range Jumps {
		out[i] = proxy.Hook{Table: j.Table, Chain: j.Chain, Target: j.Args[len(j.Args)-1]}
	}
	return out
}

// cleanupBackends removes every rule and chain of the Service proxy from
// both iptables backends of both families: a node may have switched
// backends too.
func cleanupBackends(cfg proxy.Config) error {
	var errs []error
	for _, b := range ipt.Backends {
		for _, f := range ipfamily.All {
			r := ipt.Runner{Backend: b, Family: f}
			if !r.Contains(ChainPrefix) {
				continue
			}
			if err := Cleanup(r); err != nil {
				errs = append(errs, fmt.Errorf("clean up %v iptables-%s: %w", f, b, err))
				continue
			}
			cfg.Logger.Info("service proxy rules removed", "backend", b, "family", f)
		}
	}
	return errors.Join(errs...)
}
