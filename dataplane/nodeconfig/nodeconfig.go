// Package nodeconfig is the one contract between proxyd and the CNI plugin:
// the node's podCIDRs, the cluster CIDRs and the pod MTU, in a small JSON
// file that proxyd writes atomically and the plugin reads on every ADD.
//
// A dual-stack node has one podCIDR per family in podCIDRs; podCIDR stays
// the IPv4 one (or the only one), so a plugin of a release that knew only
// podCIDR keeps attaching pods, with their IPv4 address, during an upgrade.
package nodeconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/podnet/podnet/dataplane/atomicfile"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// DefaultPath is where proxyd writes the node config on a real node.
const DefaultPath = "/run/podnet/node.json"

// Config is the node config. Readers ignore fields they don't know, so more
// may be added without breaking older plugins.
type Config struct {
	// PodCIDR is the IPv4 podCIDR, or the only one.
	PodCIDR netip.Prefix `json:"podCIDR"`
	// PodCIDRs holds one podCIDR per family, PodCIDR among them; empty in
	// files of a release before dual-stack (PodCIDR alone then).
	PodCIDRs []netip.Prefix `json:"podCIDRs,omitempty"`
	// ClusterCIDR is the IPv4 cluster CIDR, or the only one;
	// ClusterCIDRs holds one per family, as PodCIDRs.
	ClusterCIDR  netip.Prefix   `json:"clusterCIDR"`
	ClusterCIDRs []netip.Prefix `json:"clusterCIDRs,omitempty"`
	MTU          int            `json:"mtu"`
}

// New returns the config of a node with podCIDRs (one per family) in the
// cluster CIDRs: PodCIDR and ClusterCIDR are the IPv4 ones, or the only
// ones, and the lists are set only when there is more than one family,
// so a single-stack node writes the file an older release wrote.
func New(podCIDRs, clusterCIDRs []netip.Prefix, mtu int) Config {
	c := Config{PodCIDR: primary(podCIDRs), ClusterCIDR: primary(clusterCIDRs), MTU: mtu}
	if len(podCIDRs) > 1 {
		c.PodCIDRs = podCIDRs
	}
	if len(clusterCIDRs) > 1 {
		c.ClusterCIDRs = clusterCIDRs
	}
	return c
}

// primary is the IPv4 prefix of ps, else its first.
func primary(ps []netip.Prefix) netip.Prefix {
	if v4 := ipfamily.IPv4.Prefixes(ps); len(v4) > 0 {
		return v4[0]
	}
	if len(ps) > 0 {
		return ps[0]
	}
	return netip.Prefix{}
}

// Pods returns the node's podCIDRs, one per family: PodCIDRs, or PodCIDR
// alone in a file without the list.
func (c Config) Pods() []netip.Prefix {
	if len(c.PodCIDRs) > 0 {
		return c.PodCIDRs
	}
	return []netip.Prefix{c.PodCIDR}
}

// Clusters returns the cluster CIDRs, one per family (none if unknown).
func (c Config) Clusters() []netip.Prefix {
	if len(c.ClusterCIDRs) > 0 {
		return c.ClusterCIDRs
	}
	if c.ClusterCIDR.IsValid() {
		return []netip.Prefix{c.ClusterCIDR}
	}
	return nil
}

// ErrNotFound is returned by Read while the file does not exist yet.
var ErrNotFound = errors.New("node config not found")

// Validate reports the first field that is missing or out of range.
func (c Config) Validate() error {
	if !c.PodCIDR.IsValid() {
		return errors.New("podCIDR: missing")
	}
	if err := onePerFamily("clusterCIDRs", c.ClusterCIDRs, c.ClusterCIDR); err != nil {
		return err
	}
	if err := onePerFamily("podCIDRs", c.PodCIDRs, c.PodCIDR); err != nil {
		return err
	}
	if len(c.PodCIDRs) > 0 && primary(c.PodCIDRs) != c.PodCIDR {
		return fmt.Errorf("podCIDR: %s, but podCIDRs %v say %s (podCIDR is the IPv4 one, or the only one)", c.PodCIDR, c.PodCIDRs, primary(c.PodCIDRs))
	}
	for _, p := range c.Pods() {
		if err := c.validPod(p); err != nil {
			return err
		}
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return fmt.Errorf("mtu: %d out of range 576-65535", c.MTU)
	}
	return nil
}

// onePerFamily checks a list of prefixes: at most one per family, holding
// single (the list's IPv4 entry, or its only one) when both are given.
func onePerFamily(field string, ps []netip.Prefix, single netip.Prefix) error {
	seen := map[ipfamily.Family]netip.Prefix{}
	for _, p := range ps {
		f := ipfamily.OfPrefix(p)
		if other, dup := seen[f]; dup {
			return fmt.Errorf("%s: %s and %s are both %v; want one per family", field, other, p, f)
		}
		seen[f] = p
	}
	if len(ps) > 0 && single.IsValid() && !slices.Contains(ps, single) {
		return fmt.Errorf("%s: %v does not hold %s", field, ps, single)
	}
	return nil
}

// validPod checks one podCIDR against its family's cluster CIDR.
func (c Config) validPod(p netip.Prefix) error {
	if p != p.Masked() {
		return fmt.Errorf("podCIDR: %s has host bits set", p)
	}
	if p.Bits() > p.Addr().BitLen()-2 {
		return fmt.Errorf("podCIDR: %s is too small for pods (need /%d or larger)", p, p.Addr().BitLen()-2)
	}
	f := ipfamily.OfPrefix(p)
	for _, cc := range c.Clusters() {
		if f.HasPrefix(cc) && !cc.Contains(p.Addr()) {
			return fmt.Errorf("podCIDR: %s is outside clusterCIDR %s", p, cc)
		}
	}
	return nil
}

// Read loads and validates the node config at path. A missing file is
// ErrNotFound (wrapped with the path).
func Read(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, fmt.Errorf("read node config %s: %w", path, ErrNotFound)
	}
	if err != nil {
		return Config{}, fmt.Errorf("read node config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return Config{}, fmt.Errorf("decode node config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("node config %s: %w", path, err)
	}
	return c, nil
}

// Write stores c at path atomically: a reader sees the old file or the new
// one, never a torn write, even across a crash.
func Write(path string, c Config) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("write node config: %w", err)
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode node config: %w", err)
	}
	return atomicfile.WriteFile(path, append(data, '\n'), 0o644)
}
