package ebpf

import (
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/routing"
)

// The tc program goes on every path traffic from outside a node takes in:
// the uplink, the pod bridge and the VXLAN device (decapsulated packets
// never meet the uplink's program); onto an interface that appears later
// (the bridge with the first pod) or is made anew at once, not at the
// next full sync.
func TestProxierAttachesTC(t *testing.T) {
	e := newSockEnv(t)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", e.name()}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	vxlan := func() {
		ip("link", "add", routing.DefaultDevice, "type", "vxlan", "id", "1", "dstport", "8472", "nolearning")
		ip("link", "set", routing.DefaultDevice, "up")
	}
	vxlan()
	p := NewProxier(Config{PinDir: e.pinDir, Cgroup: e.cgroup, Uplinks: []string{"up0"}})
	t.Cleanup(func() { p.Close() })
	sync := func() {
		t.Helper()
		err := ns.WithNetNSPath(e.nsPath, func(ns.NetNS) error {
			_, err := p.Sync(map[cluster.Key][]*proxy.ServicePort{}, nil, true)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// want waits up to 2 s for one program on each of ifaces.
	want := func(when string, ifaces ...string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for _, iface := range ifaces {
			n := e.tcxIngress(iface)
			for ; n != 1 && time.Now().Before(deadline); n = e.tcxIngress(iface) {
				time.Sleep(20 * time.Millisecond)
			}
			if n != 1 {
				t.Errorf("%s: %d tc programs on %s, want 1", when, n, iface)
			}
		}
	}
	sync()
	want("first sync", "up0", routing.DefaultDevice)
	ip("link", "add", "cbr0", "type", "bridge")
	want("the bridge made after the first sync, no sync since", "cbr0")
	// The agent recreates the VXLAN device when its settings change.
	ip("link", "del", routing.DefaultDevice)
	vxlan()
	want("the VXLAN device made anew, no sync since", routing.DefaultDevice)
	sync()
	want("a full sync", "up0", "cbr0", routing.DefaultDevice)
}

// name is the test namespace's name.
func (e *sockEnv) name() string {
	return e.nsPath[len("/var/run/netns/"):]
}

// tcxIngress counts the tcx ingress programs on iface in the test
// namespace.
func (e *sockEnv) tcxIngress(iface string) int {
	e.t.Helper()
	var n int
	err := ns.WithNetNSPath(e.nsPath, func(ns.NetNS) error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		n = len(res.Programs)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}
