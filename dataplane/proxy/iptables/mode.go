package iptables

import (
	"errors"
	"fmt"

	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Mode is the iptables proxy mode: one iptables-restore per sync into the
// backend (nft or legacy) the node's runner uses.
var Mode = proxy.Mode{
	Name: "iptables",
	Probe: func(cfg proxy.Config) error {
		return cfg.IPTables.Available()
	},
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		if cfg.IPTables.Backend == "" {
			return nil, errors.New("no iptables backend chosen")
		}
		cfg.Logger.Info("service proxy: iptables mode", "backend", cfg.IPTables.Backend)
		return NewProxier(Config{
			ClusterCIDR:       cfg.ClusterCIDR,
			NodePortAddresses: cfg.NodePortAddresses,
			MasqueradeAll:     cfg.MasqueradeAll,
		}, cfg.IPTables), nil
	},
	Cleanup: cleanupBackends,
}

// cleanupBackends removes every rule and chain of the Service proxy from
// both iptables backends: a node may have switched backends too.
func cleanupBackends(cfg proxy.Config) error {
	var errs []error
	for _, b := range ipt.Backends {
		r := ipt.Runner{Backend: b}
		if !r.Contains(ChainPrefix) {
			continue
		}
		if err := Cleanup(r); err != nil {
			errs = append(errs, fmt.Errorf("clean up iptables-%s: %w", b, err))
			continue
		}
		cfg.Logger.Info("service proxy rules removed", "backend", b)
	}
	return errors.Join(errs...)
}
