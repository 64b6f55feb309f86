package nodenet

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/routing"
)

// TestNoPodNetwork: while flannel still runs the pod network (proxyd
// --pod-network none), a sync sets the sysctls and the node firewall (the
// Service proxy's hooks go there) but adds no route, VXLAN device or
// masquerade rule and writes no node config, with peers in the state.
func TestNoPodNetwork(t *testing.T) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	ipt := hostnet.NewFakeIPTables()
	n, store := newTestNodeNet(t, routing.BackendAuto, k, ipt)
	n.o.NoPodNetwork = true
	store.Upsert(testNode("node1", "192.168.10.11", "10.244.1.0/24"))
	store.Upsert(testNode("node2", "192.168.10.12", "10.244.2.0/24"))
	store.Upsert(testNode("node4", "192.168.20.11", "10.244.4.0/24"))
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	if k.Mutations != 0 {
		t.Errorf("%d netlink changes, want none:\n%s", k.Mutations, k.Dump())
	}
	if _, err := nodeconfig.Read(n.o.NodeConfigPath); !errors.Is(err, nodeconfig.ErrNotFound) {
		t.Errorf("node config written: %v", err)
	}
	if s := n.sysctl.(fakeSysctl); s["net/ipv4/ip_forward"] != "1" {
		t.Errorf("sysctls = %v", s)
	}
	if d := ipt.Dump(); strings.Contains(d, "MASQUERADE") || !strings.Contains(d, hostnet.ChainForward) {
		t.Errorf("node firewall without masquerade, with its forward chain, wanted:\n%s", d)
	}
	// Back to podnet's pod network: the next sync routes the peers.
	n.o.NoPodNetwork = false
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.Dump(), "route 10.244.2.0/24 via 192.168.10.12 dev eth0") {
		t.Errorf("no route after switching to podnet's pod network:\n%s", k.Dump())
	}
}
