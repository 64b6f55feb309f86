package cni

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"podnet","type":"podnet"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "cbr0" || c.MTU != 0 || !c.HairpinMode || c.NodeConfig != "/run/podnet/node.json" ||
		len(c.Subnets) != 0 || c.DataDir != "/var/lib/podnet/ipam" || c.LogFile != "" ||
		c.BootIDFile != "/proc/sys/kernel/random/boot_id" {
		t.Errorf("defaults: %+v", c)
	}
	if c.storeDir() != "/var/lib/podnet/ipam/podnet" {
		t.Errorf("store dir %s", c.storeDir())
	}
}

func TestConfigFields(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n1","type":"podnet","bridge":"br-pods","mtu":1400,
		"hairpinMode":false,"nodeConfig":"/x/node.json","subnet":"10.9.0.0/24","dataDir":"/x/ipam","logFile":"/x/cni.log"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "br-pods" || c.MTU != 1400 || c.HairpinMode || c.NodeConfig != "/x/node.json" ||
		!slices.Equal(c.Subnets, []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}) || c.DataDir != "/x/ipam" || c.LogFile != "/x/cni.log" {
		t.Errorf("decoded %+v", c)
	}
	pn, err := c.network()
	if err != nil || !slices.Equal(pn.PodCIDRs, c.Subnets) || pn.MTU != 1400 {
		t.Errorf("network() = %+v, %v; want the subnet and MTU 1400 without reading a node config", pn, err)
	}
}

func TestConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, tc := range []struct {
		field string // JSON fragment
		code  uint
		want  []string
	}{
		{`"mtu":"1500"`, types.ErrInvalidNetworkConfig, []string{"mtu", `"1500"`}},
		{`"mtu":70000`, types.ErrInvalidNetworkConfig, []string{"mtu", "70000"}},
		{`"mtu":100`, types.ErrInvalidNetworkConfig, []string{"mtu", "100"}},
		{`"mtu":1500.5`, types.ErrInvalidNetworkConfig, []string{"mtu", "1500.5"}},
		{`"hairpinMode":"yes"`, types.ErrInvalidNetworkConfig, []string{"hairpinMode", `"yes"`}},
		{`"bridge":42`, types.ErrInvalidNetworkConfig, []string{"bridge", "42"}},
		{`"bridge":"a-very-long-bridge-name"`, types.ErrInvalidNetworkConfig, []string{"bridge", "a-very-long-bridge-name", "15"}},
		{`"subnet":"10.0.0.0/33"`, types.ErrInvalidNetworkConfig, []string{"subnet", "10.0.0.0/33"}},
		{`"subnet":"10.0.0.1/24"`, types.ErrInvalidNetworkConfig, []string{"subnet", "10.0.0.1/24", "host bits"}},
		{`"subnet":"10.0.0.0/31"`, types.ErrInvalidNetworkConfig, []string{"subnet", "too small"}},
		{`"subnet":"10.0.0.0/24,10.1.0.0/24"`, types.ErrInvalidNetworkConfig, []string{"subnet", "both IPv4; want one per family"}},
		{`"subnet":"fd00::/127"`, types.ErrInvalidNetworkConfig, []string{"subnet", "too small", "/126"}},
		{`"subnet":[1]`, types.ErrInvalidNetworkConfig, []string{"subnet", "[1]"}},
		{`"dataDir":"relative/dir"`, types.ErrInvalidNetworkConfig, []string{"dataDir", "relative/dir"}},
		{`"nodeConfig":""`, types.ErrInvalidNetworkConfig, []string{"nodeConfig"}},
		{`"logFile":"cni.log"`, types.ErrInvalidNetworkConfig, []string{"logFile", "cni.log"}},
		{`"logFormat":"xml"`, types.ErrInvalidNetworkConfig, []string{"logFormat", "xml"}},
		{`"cniVersion":5`, types.ErrDecodingFailure, []string{"decode"}},
	} {
		_, err := ParseConfig([]byte(`{"name":"podnet","type":"podnet",` + tc.field + `}`))
		if err == nil {
			t.Errorf("%s: no error", tc.field)
			continue
		}
		e, ok := err.(*types.Error)
		if !ok || e.Code != tc.code {
			t.Errorf("%s: %v, want CNI error code %d", tc.field, err, tc.code)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(e.Msg, w) {
				t.Errorf("%s: message %q does not name %q", tc.field, e.Msg, w)
			}
		}
	}
	if _, err := ParseConfig([]byte(`{"name":`)); err == nil || err.(*types.Error).Code != types.ErrDecodingFailure {
		t.Errorf("truncated JSON: %v, want code 6", err)
	}
}

func TestConfigPrevResult(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"podnet","type":"podnet","prevResult":{"cniVersion":"1.0.0",
		"interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],"ips":[{"interface":0,"address":"10.1.0.5/24","gateway":"10.1.0.1"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.PrevResult == nil || c.PrevResult.Version() != "1.0.0" {
		t.Errorf("prevResult %v", c.PrevResult)
	}
}

// TestConfigSubnetPerFamily: "subnet" takes one prefix per family, and the
// pod network lists them IPv4 first whatever the order written.
func TestConfigSubnetPerFamily(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"n1","type":"podnet","subnet":"fd00:10:244:1::/64, 10.9.0.0/24"}`))
	if err != nil {
		t.Fatal(err)
	}
	pn, err := c.network()
	want := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if err != nil || !slices.Equal(pn.PodCIDRs, want) {
		t.Errorf("network() = %+v, %v; want %v", pn, err, want)
	}
}
