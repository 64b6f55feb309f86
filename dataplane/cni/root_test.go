package cni

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/link"
)

// inNS runs fn inside n and fails t on error.
func inNS(t testing.TB, n ns.NetNS, fn func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

func linkExists(t testing.TB, n ns.NetNS, name string) bool {
	t.Helper()
	exists := false
	inNS(t, n, func() error {
		_, err := netlink.LinkByName(name)
		if err != nil && !link.NotFound(err) {
			return err
		}
		exists = err == nil
		return nil
	})
	return exists
}

func TestAddCheckDelEveryVersion(t *testing.T) {
	for _, v := range VersionInfo.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t, nodeOptions{version: v, podCIDR: "10.244.3.0/24", mtu: 1400})
			pod := newNetNS(t, "pod")
			res, err := n.add(pod, "ctr-a", "eth0")
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			r := mustConvert(t, res)
			addr := podAddr(t, r)
			if !netip.MustParsePrefix("10.244.3.0/24").Contains(addr) || addr == netip.MustParseAddr("10.244.3.1") {
				t.Errorf("pod address %s: want a host address of 10.244.3.0/24 other than the gateway", addr)
			}
			if gw := r.IPs[0].Gateway.String(); gw != "10.244.3.1" {
				t.Errorf("gateway %s, want 10.244.3.1", gw)
			}
			if len(r.Interfaces) != 3 || r.Interfaces[0].Name != "cbr0" ||
				r.Interfaces[1].Name != link.HostVethName("ctr-a", "eth0") ||
				r.Interfaces[2].Name != "eth0" || r.Interfaces[2].Sandbox != pod.Path() {
				t.Errorf("interfaces %v: want cbr0, host veth, eth0 in the pod", r.Interfaces)
			}
			if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" || r.Routes[0].GW.String() != "10.244.3.1" {
				t.Errorf("routes %v: want default via 10.244.3.1", r.Routes)
			}

			// The kernel agrees with the result.
			var st link.PodState
			st, err = link.InspectPod(pod, "eth0", netlink.FAMILY_V4)
			if err != nil {
				t.Fatal(err)
			}
			if st.MTU != 1400 || !st.Up || st.DefaultGW != netip.MustParseAddr("10.244.3.1") ||
				len(st.Addrs) != 1 || st.Addrs[0] != netip.PrefixFrom(addr, 24) || st.MAC != r.Interfaces[2].Mac {
				t.Errorf("pod eth0 state %+v does not match the result %v", st, r)
			}
			inNS(t, n.ns, func() error {
				br, err := netlink.LinkByName("cbr0")
				if err != nil {
					return err
				}
				hv, err := netlink.LinkByName(link.HostVethName("ctr-a", "eth0"))
				if err != nil {
					return err
				}
				if hv.Attrs().MasterIndex != br.Attrs().Index || hv.Attrs().MTU != 1400 {
					t.Errorf("host veth master %d mtu %d, want %d and 1400", hv.Attrs().MasterIndex, hv.Attrs().MTU, br.Attrs().Index)
				}
				pi, err := netlink.LinkGetProtinfo(hv)
				if err != nil {
					return err
				}
				if !pi.Hairpin {
					t.Error("hairpin is off on the bridge port")
				}
				addrs, err := link.Addrs(br, netlink.FAMILY_V4)
				if err != nil {
					return err
				}
				if len(addrs) != 1 || addrs[0] != netip.MustParsePrefix("10.244.3.1/24") {
					t.Errorf("cbr0 addresses %v, want [10.244.3.1/24]", addrs)
				}
				return nil
			})

			if v >= "0.4.0" {
				if err := n.check(pod, "ctr-a", "eth0"); err != nil {
					t.Errorf("CHECK after ADD: %v", err)
				}
				// A changed MTU is reported.
				inNS(t, pod, func() error {
					l, err := netlink.LinkByName("eth0")
					if err != nil {
						return err
					}
					return netlink.LinkSetMTU(l, 1300)
				})
				err := n.check(pod, "ctr-a", "eth0")
				if err == nil || !strings.Contains(err.Error(), "MTU 1300, want 1400") {
					t.Errorf("CHECK after changing the pod MTU: %v, want an error naming MTU 1300", err)
				}
			}

			if err := n.del(pod, "ctr-a", "eth0"); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if linkExists(t, n.ns, link.HostVethName("ctr-a", "eth0")) || linkExists(t, pod, "eth0") {
				t.Error("veth pair still exists after DEL")
			}
			if al := n.allocations(); len(al) != 0 {
				t.Errorf("allocations after DEL: %v", al)
			}
			if err := n.del(pod, "ctr-a", "eth0"); err != nil {
				t.Errorf("second DEL: %v", err)
			}
		})
	}
}

func mustConvert(t testing.TB, res types.Result) *current.Result {
	t.Helper()
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDelIsIdempotent(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pod := newNetNS(t, "pod")
	n.mustAdd(pod, "ctr-del", "eth0")

	other := newNetNS(t, "pod")
	if err := n.del(other, "never-seen", "eth0"); err != nil {
		t.Errorf("DEL of a container the plugin never saw: %v", err)
	}
	// The pod namespace goes away before DEL (the runtime tore it down).
	podPath := pod.Path()
	deleteNetNS(t, pod)
	if err := n.inNode(func() error {
		return n.cni.DelNetworkList(t.Context(), n.list, rtPath(podPath, "ctr-del", "eth0"))
	}); err != nil {
		t.Errorf("DEL after the netns was deleted: %v", err)
	}
	if linkExists(t, n.ns, link.HostVethName("ctr-del", "eth0")) {
		t.Error("host veth survived DEL")
	}
	if al := n.allocations(); len(al) != 0 {
		t.Errorf("allocations after DEL: %v", al)
	}
	if err := n.inNode(func() error {
		return n.cni.DelNetworkList(t.Context(), n.list, rtPath(podPath, "ctr-del", "eth0"))
	}); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

func TestAddTwiceForOneAttachment(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pod := newNetNS(t, "pod")
	first := podAddr(t, n.mustAdd(pod, "ctr-twice", "eth0"))
	second := podAddr(t, n.mustAdd(pod, "ctr-twice", "eth0"))
	if first != second {
		t.Errorf("second ADD gave %s, first %s: one attachment must keep its address", second, first)
	}
	if al := n.allocations(); len(al) != 1 || al[0].Addr != first {
		t.Errorf("allocations %v, want exactly %s", al, first)
	}
	if err := n.check(pod, "ctr-twice", "eth0"); err != nil {
		t.Errorf("CHECK after the second ADD: %v", err)
	}
	other := newNetNS(t, "pod")
	otherAddr := podAddr(t, n.mustAdd(other, "ctr-other", "eth0"))
	if err := ping(other, first); err != nil {
		t.Errorf("ping %s -> %s after the repeated ADD: %v", otherAddr, first, err)
	}
}

func rtPath(netnsPath, cid, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: cid, NetNS: netnsPath, IfName: ifname}
}
