package iptables

import (
	"errors"
	"fmt"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Mode is the iptables proxy mode: one iptables-restore per sync into the
// backend (nft or legacy) the node's runner uses.
var Mode = proxy.Mode{
	Name: "iptables",
	Probe: func(cfg proxy.Config) error {
		return cfg.IPTables.For(cfg.Family).Available()
	},
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		if cfg.IPTables.Backend == "" {
			return nil, errors.New("no iptables backend chosen")
		}
		cfg.Logger.Info("service proxy: iptables mode", "backend", cfg.IPTables.Backend, "family", cfg.Family)
		return NewProxier(Config{
			Family:            cfg.Family,
			ClusterCIDR:       cfg.ClusterCIDR,
			NodePortAddresses: cfg.NodePortAddresses,
			MasqueradeAll:     cfg.MasqueradeAll,
		}, cfg.IPTables.For(cfg.Family)), nil
	},
	Cleanup: cleanupBackends,
	Hooks:   hooks(),
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
