package nftables

import (
	"fmt"

	nft "github.com/google/nftables"

	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"

	"github.com/podnet/podnet/dataplane/proxy"
)

// nodePrefix starts the names of the node firewall's objects in the
// table, which no Proxier owns.
const nodePrefix = "node-"

// Mode is the nftables proxy mode: podnet's own inet table through
// netlink. It keeps no rule in iptables' chains, so it has no Hooks, and
// brings the node firewall into its table (Firewall).
var Mode = proxy.Mode{
	Name:  "nftables",
	Probe: func(proxy.Config) error { return Probe(Netlink{}) },
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		cfg.Logger.Info("service proxy: nftables mode", "table", "inet "+TableName, "family", cfg.Family)
		return NewProxier(Config{
			Family:            cfg.Family,
			ClusterCIDR:       cfg.ClusterCIDR,
			NodePortAddresses: cfg.NodePortAddresses,
			MasqueradeAll:     cfg.MasqueradeAll,
		}, Netlink{}), nil
	},
	NodeFirewall: func(f ipfamily.Family) hostnet.NodeFirewall {
		return &Firewall{Family: f, Kernel: Netlink{}}
	},
	Cleanup: func(cfg proxy.Config) error {
		if err := (Netlink{}).Cleanup(); err != nil {
			return fmt.Errorf("delete table inet %s: %w", TableName, err)
		}
		return nil
	},
}

func init() { proxy.Register(Mode) }

// Probe reports whether the kernel answers nf_tables requests.
func Probe(k Netlink) error {
	c, err := k.conn()
	if err != nil {
		return fmt.Errorf("nf_tables netlink: %w", err)
	}
	if _, err := c.ListTablesOfFamily(nft.TableFamilyINet); err != nil {
		return fmt.Errorf("nf_tables: list inet tables: %w", err)
	}
	return nil
}
