// Package nodeconfig is the one contract between proxyd and the CNI plugin:
// the node's podCIDR, the cluster CIDR and the pod MTU, in a small JSON file
// that proxyd writes atomically and the plugin reads on every ADD.
package nodeconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/podnet/podnet/dataplane/atomicfile"
)

// DefaultPath is where proxyd writes the node config on a real node.
const DefaultPath = "/run/podnet/node.json"

// Config is the node config. Readers ignore fields they don't know, so more
// may be added without breaking older plugins.
type Config struct {
	PodCIDR     netip.Prefix `json:"podCIDR"`
	ClusterCIDR netip.Prefix `json:"clusterCIDR"`
	MTU         int          `json:"mtu"`
}

// ErrNotFound is returned by Read while the file does not exist yet.
var ErrNotFound = errors.New("node config not found")

// Validate reports the first field that is missing or out of range.
func (c Config) Validate() error {
	if !c.PodCIDR.IsValid() {
		return errors.New("podCIDR: missing")
	}
	if c.PodCIDR != c.PodCIDR.Masked() {
		return fmt.Errorf("podCIDR: %s has host bits set", c.PodCIDR)
	}
	if c.PodCIDR.Addr().Is4() && c.PodCIDR.Bits() > 30 {
		return fmt.Errorf("podCIDR: %s is too small for pods (need /30 or larger)", c.PodCIDR)
	}
	if c.ClusterCIDR.IsValid() && !c.ClusterCIDR.Contains(c.PodCIDR.Addr()) {
		return fmt.Errorf("podCIDR: %s is outside clusterCIDR %s", c.PodCIDR, c.ClusterCIDR)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return fmt.Errorf("mtu: %d out of range 576-65535", c.MTU)
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
