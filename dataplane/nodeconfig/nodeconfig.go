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
	"path/filepath"
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
	return WriteFileAtomic(path, append(data, '\n'), 0o644)
}

// WriteFileAtomic writes data to a temporary file beside path, fsyncs it,
// renames it over path and fsyncs the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file in %s: %w", dir, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
