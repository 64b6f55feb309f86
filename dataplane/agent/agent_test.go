package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/podnet/podnet/dataplane/routing"
)

func TestOptionsValidate(t *testing.T) {
	good := Options{
		NodeName: "node1", StateDir: "/state", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Backend: routing.BackendAuto, VXLANVNI: 1, VXLANPort: 8472, NodeConfigPath: "/run/podnet/node.json",
		SyncPeriod: 30 * time.Second, MinSyncPeriod: time.Second,
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	tests := []struct {
		field  string
		change func(*Options)
	}{
		{"--node-name", func(o *Options) { o.NodeName = "" }},
		{"--state-dir", func(o *Options) { o.StateDir = "" }},
		{"--kubeconfig", func(o *Options) { o.Kube = &rest.Config{Host: "https://127.0.0.1:6443"} }},
		{"--allocate-node-cidrs", func(o *Options) { o.AllocateNodeCIDRs = true }},
		{"--cluster-cidr", func(o *Options) { o.ClusterCIDRs = nil }},
		{"--cluster-cidr", func(o *Options) {
			o.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")}
		}},
		{"--node-config", func(o *Options) { o.NodeConfigPath = "" }},
		{"--sync-period", func(o *Options) { o.SyncPeriod = 0 }},
		{"--min-sync-period", func(o *Options) { o.MinSyncPeriod = time.Minute }},
		{"--backend", func(o *Options) { o.Backend = "ipip" }},
		{"--vxlan-vni", func(o *Options) { o.VXLANVNI = 1 << 24 }},
		{"--vxlan-port", func(o *Options) { o.VXLANPort = 0 }},
	}
	for _, tt := range tests {
		o := good
		tt.change(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: err = %v, want one naming the flag", tt.field, err)
		}
	}
}

type fakeSysctl map[string]string

func (f fakeSysctl) Get(name string) (string, error) { return f[name], nil }
func (f fakeSysctl) Set(name, v string) error        { f[name] = v; return nil }
