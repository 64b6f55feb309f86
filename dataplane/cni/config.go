package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nodeconfig"
)

// Defaults of the plugin config fields.
const (
	DefaultBridge  = "cbr0"
	DefaultDataDir = "/var/lib/podnet/ipam"
	DefaultMTU     = 1500
)

// Config is one podnet entry of a conflist, as the runtime hands it to the
// plugin (with name, cniVersion, prevResult and GC's valid attachments).
type Config struct {
	types.PluginConf

	// Bridge is the node bridge every pod hangs off.
	Bridge string `json:"bridge"`
	// MTU of both veth ends and the bridge; 0 takes the node config's MTU
	// (or 1500 if that has none).
	MTU int `json:"mtu"`
	// HairpinMode lets a pod reach itself through a Service VIP.
	HairpinMode bool `json:"hairpinMode"`
	// NodeConfig is the file proxyd writes with the node's podCIDR.
	NodeConfig string `json:"nodeConfig"`
	// Subnets, if set, are the podCIDRs to use instead of the node
	// config's, for running the plugin without proxyd: the field "subnet",
	// one prefix or one per family separated by a comma.
	Subnets []netip.Prefix `json:"-"`
	// DataDir holds the IPAM store (one subdirectory per network).
	DataDir string `json:"dataDir"`
	// LogFile receives the plugin's log; empty logs warnings to stderr.
	LogFile string `json:"logFile"`
	// LogFormat is "text" (the default) or "json".
	LogFormat string `json:"logFormat"`
	// BootIDFile is read to detect reboots; tests point it elsewhere.
	BootIDFile string `json:"bootIDFile"`

	// hasValidAttachments tells GC's "none is valid" (an empty or null
	// list) from a config without the list at all.
	hasValidAttachments bool
}

// DefaultConfig is the config before the runtime's JSON is applied.
func DefaultConfig() Config {
	return Config{
		Bridge:      DefaultBridge,
		HairpinMode: true,
		NodeConfig:  nodeconfig.DefaultPath,
		DataDir:     DefaultDataDir,
		BootIDFile:  ipam.DefaultBootIDFile,
	}
}

// fieldKinds names, for error messages, what each plugin-specific field
// must hold.
var fieldKinds = map[string]string{
	"bridge":      "a string",
	"mtu":         "an integer",
	"hairpinMode": "true or false",
	"nodeConfig":  "a string",
	"subnet":      "a CIDR string like \"10.244.1.0/24\" or one per family, \"10.244.1.0/24,fd00:10:244:1::/64\"",
	"dataDir":     "a string",
	"logFile":     "a string",
	"logFormat":   "\"text\" or \"json\"",
	"bootIDFile":  "a string",
}

// ParseConfig decodes and validates the plugin's stdin. Undecodable JSON is
// a CNI error 6, a field of the wrong type or out of range a CNI error 7
// naming the field and the value.
func ParseConfig(data []byte) (*Config, error) {
	c := DefaultConfig()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network config: "+err.Error(), "")
	}
	if err := json.Unmarshal(data, &c.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network config: "+err.Error(), "")
	}
	targets := []struct {
		field  string
		target any
	}{
		{"bridge", &c.Bridge}, {"mtu", &c.MTU}, {"hairpinMode", &c.HairpinMode},
		{"nodeConfig", &c.NodeConfig}, {"dataDir", &c.DataDir}, {"logFile", &c.LogFile}, {"logFormat", &c.LogFormat},
		{"bootIDFile", &c.BootIDFile},
	}
	for _, f := range targets {
		v, ok := raw[f.field]
		if !ok || string(v) == "null" {
			continue
		}
		if err := json.Unmarshal(v, f.target); err != nil {
			return nil, invalidf("%s: want %s, got %s", f.field, fieldKinds[f.field], v)
		}
	}
	if _, ok := raw["cni.dev/valid-attachments"]; ok {
		c.hasValidAttachments = true
	} else if v, ok := raw["cni.dev/attachments"]; ok {
		// The name an early version of the 1.1 spec used.
		c.hasValidAttachments = true
		if err := json.Unmarshal(v, &c.ValidAttachments); err != nil {
			return nil, invalidf("cni.dev/attachments: want a list of {containerID, ifname}, got %s", v)
		}
	}
	if v, ok := raw["subnet"]; ok && string(v) != "null" {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, invalidf("subnet: want %s, got %s", fieldKinds["subnet"], v)
		}
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			p, err := netip.ParsePrefix(part)
			if err != nil {
				return nil, invalidf("subnet: want %s, got %q", fieldKinds["subnet"], s)
			}
			c.Subnets = append(c.Subnets, p)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network config: "+err.Error(), "")
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult: "+err.Error(), "")
		}
	}
	return &c, nil
}

func invalidf(format string, args ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid network config: "+fmt.Sprintf(format, args...), "")
}

// Validate reports the first field whose value is out of range.
func (c *Config) Validate() error {
	if err := validIfName(c.Bridge); err != nil {
		return fmt.Errorf("bridge: %q %w", c.Bridge, err)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return fmt.Errorf("mtu: %d out of range 576-65535", c.MTU)
	}
	fams := map[ipfamily.Family]netip.Prefix{}
	for _, sn := range c.Subnets {
		if sn != sn.Masked() {
			return fmt.Errorf("subnet: %s has host bits set (did you mean %s?)", sn, sn.Masked())
		}
		if _, _, ok := ipam.Usable(sn); !ok {
			return fmt.Errorf("subnet: %s is too small for pods (need /%d or larger)", sn, sn.Addr().BitLen()-2)
		}
		f := ipfamily.OfPrefix(sn)
		if other, dup := fams[f]; dup {
			return fmt.Errorf("subnet: %s and %s are both %v; want one per family", other, sn, f)
		}
		fams[f] = sn
	}
	for _, f := range []struct{ name, path string }{
		{"nodeConfig", c.NodeConfig}, {"dataDir", c.DataDir}, {"bootIDFile", c.BootIDFile},
	} {
		if f.path == "" || !filepath.IsAbs(f.path) {
			return fmt.Errorf("%s: %q is not an absolute path", f.name, f.path)
		}
	}
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		return fmt.Errorf("logFile: %q is not an absolute path", c.LogFile)
	}
	if c.LogFormat != "" && c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("logFormat: %q is not text or json", c.LogFormat)
	}
	return nil
}

type strErr string

func (e strErr) Error() string { return string(e) }

// validIfName applies the kernel's rules for interface names.
func validIfName(name string) error {
	switch {
	case name == "":
		return strErr("is empty")
	case len(name) > 15:
		return strErr("is longer than 15 bytes")
	case name == "." || name == "..":
		return strErr("is not a valid interface name")
	case strings.ContainsAny(name, "/: \t\n"):
		return strErr("contains '/', ':' or white space")
	}
	return nil
}

// storeDir is the IPAM directory of the network.
func (c *Config) storeDir() string { return filepath.Join(c.DataDir, c.Name) }

// podNetwork is what ADD needs from the node: the podCIDRs (one per
// family, IPv4 first) and the MTU.
type podNetwork struct {
	PodCIDRs []netip.Prefix
	MTU      int
}

// ipv4First orders podCIDRs by family, IPv4 first: the pod's first address
// (its MAC's source, the result's first IP) is the IPv4 one, as on a node
// of the release before dual-stack.
func ipv4First(ps []netip.Prefix) []netip.Prefix {
	out := append(ipfamily.IPv4.Prefixes(ps), ipfamily.IPv6.Prefixes(ps)...)
	for i := range out {
		out[i] = out[i].Masked()
	}
	return out
}

// network resolves the pod network: the subnet field, or the node config.
func (c *Config) network() (podNetwork, error) {
	if len(c.Subnets) > 0 {
		return podNetwork{PodCIDRs: ipv4First(c.Subnets), MTU: orDefault(c.MTU, DefaultMTU)}, nil
	}
	nc, err := nodeconfig.Read(c.NodeConfig)
	if err != nil {
		return podNetwork{}, err
	}
	mtu := c.MTU
	if mtu == 0 {
		mtu = orDefault(nc.MTU, DefaultMTU)
	}
	return podNetwork{PodCIDRs: ipv4First(nc.Pods()), MTU: mtu}, nil
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
