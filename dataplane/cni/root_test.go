package cni

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
			st, err = link.InspectPod(pod, "eth0")
			if err != nil {
				t.Fatal(err)
			}
			if st.MTU != 1400 || !st.Up || st.DefaultGW(addr) != netip.MustParseAddr("10.244.3.1") ||
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
				if br.Attrs().HardwareAddr.String() != "0a:58:0a:f4:03:01" || r.Interfaces[0].Mac != "0a:58:0a:f4:03:01" {
					t.Errorf("cbr0 MAC %s (result %s), want the fixed 0a:58:0a:f4:03:01", br.Attrs().HardwareAddr, r.Interfaces[0].Mac)
				}
				fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
				if err != nil {
					return err
				}
				if strings.TrimSpace(string(fwd)) != "1" {
					t.Errorf("ip_forward in the node is %q, want 1", fwd)
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
				// So are a missing address and route.
				inNS(t, pod, func() error {
					l, err := netlink.LinkByName("eth0")
					if err != nil {
						return err
					}
					return link.DelAddr(l, netip.PrefixFrom(addr, 24))
				})
				err = n.check(pod, "ctr-a", "eth0")
				if err == nil || !strings.Contains(err.Error(), "want "+netip.PrefixFrom(addr, 24).String()) ||
					!strings.Contains(err.Error(), "no default route via 10.244.3.1") {
					t.Errorf("CHECK after removing the pod address: %v, want it to name the address and the route", err)
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

			// ADD twice for one attachment keeps its address.
			pod2 := newNetNS(t, "pod")
			first := podAddr(t, mustConvert(t, mustAddV(t, n, pod2, "ctr-b")))
			second := podAddr(t, mustConvert(t, mustAddV(t, n, pod2, "ctr-b")))
			if first != second {
				t.Errorf("repeated ADD gave %s, then %s", first, second)
			}
			if al := n.allocations(); len(al) != 1 {
				t.Errorf("allocations after a repeated ADD: %v, want one", al)
			}
			// DEL after the runtime deleted the netns.
			path := pod2.Path()
			deleteNetNS(t, pod2)
			if err := n.inNode(func() error {
				return n.cni.DelNetworkList(t.Context(), n.list, rtPath(path, "ctr-b", "eth0"))
			}); err != nil {
				t.Errorf("DEL after the netns was deleted: %v", err)
			}
			if al := n.allocations(); len(al) != 0 || linkExists(t, n.ns, link.HostVethName("ctr-b", "eth0")) {
				t.Errorf("DEL after the netns was deleted left allocations %v or the host veth", al)
			}
		})
	}
}

func mustAddV(t testing.TB, n *testNode, pod ns.NetNS, cid string) types.Result {
	t.Helper()
	res, err := n.add(pod, cid, "eth0")
	if err != nil {
		t.Fatalf("ADD %s: %v", cid, err)
	}
	return res
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

func TestConcurrentAddsGetDistinctAddresses(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{podCIDR: "10.244.5.0/24"})
	const pods = 50
	nss := make([]ns.NetNS, pods)
	for i := range nss {
		nss[i] = newNetNS(t, "pod")
	}
	addrs := make([]netip.Addr, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			res, err := n.add(nss[i], fmt.Sprintf("ctr-%d", i), "eth0")
			if err != nil {
				errs[i] = err
				return
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				errs[i] = err
				return
			}
			addrs[i], _ = netip.AddrFromSlice(r.IPs[0].Address.IP)
			addrs[i] = addrs[i].Unmap()
		})
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		if j, dup := seen[addrs[i]]; dup {
			t.Errorf("pods %d and %d both got %s", j, i, addrs[i])
		}
		seen[addrs[i]] = i
	}
	if al := n.allocations(); len(al) != pods {
		t.Errorf("store holds %d allocations, want %d", len(al), pods)
	}
	// Two pods reach each other over cbr0, both ways.
	if err := ping(nss[0], addrs[pods-1]); err != nil {
		t.Errorf("ping pod 0 -> pod %d (%s): %v", pods-1, addrs[pods-1], err)
	}
	if err := ping(nss[pods-1], addrs[0]); err != nil {
		t.Errorf("ping pod %d -> pod 0 (%s): %v", pods-1, addrs[0], err)
	}
	// And the gateway answers.
	if err := ping(nss[1], netip.MustParseAddr("10.244.5.1")); err != nil {
		t.Errorf("ping gateway: %v", err)
	}
}

func TestExhaustedRangeIsAClearError(t *testing.T) {
	t.Parallel()
	// A /29 has 8 addresses: network, gateway, broadcast and 5 for pods.
	n := newTestNode(t, nodeOptions{plugin: map[string]any{"subnet": "10.250.0.8/29", "mtu": 1500}})
	var pods []ns.NetNS
	got := map[netip.Addr]bool{}
	for i := range 5 {
		pod := newNetNS(t, "pod")
		pods = append(pods, pod)
		a := podAddr(t, n.mustAdd(pod, fmt.Sprintf("ctr-%d", i), "eth0"))
		if a == netip.MustParseAddr("10.250.0.8") || a == netip.MustParseAddr("10.250.0.9") || a == netip.MustParseAddr("10.250.0.15") {
			t.Errorf("handed out reserved address %s", a)
		}
		got[a] = true
	}
	if len(got) != 5 {
		t.Fatalf("5 ADDs gave %d distinct addresses", len(got))
	}
	extra := newNetNS(t, "pod")
	_, err := n.add(extra, "ctr-extra", "eth0")
	if err == nil || !strings.Contains(err.Error(), "10.250.0.8/29") || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("ADD into a full range: %v, want an error naming 10.250.0.8/29", err)
	}
	if code := cniCode(err); code != types.ErrTryAgainLater {
		t.Errorf("error code %d, want %d", code, types.ErrTryAgainLater)
	}
	if linkExists(t, n.ns, link.HostVethName("ctr-extra", "eth0")) || linkExists(t, extra, "eth0") {
		t.Error("failed ADD left a veth behind")
	}
	// Freeing one makes room again.
	if err := n.del(pods[2], "ctr-2", "eth0"); err != nil {
		t.Fatal(err)
	}
	n.mustAdd(extra, "ctr-extra", "eth0")
}

func TestNewBootFreesOldAllocations(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pod := newNetNS(t, "pod")
	old := podAddr(t, n.mustAdd(pod, "ctr-before", "eth0"))
	n.setBootID("boot-2")
	pod2 := newNetNS(t, "pod")
	fresh := podAddr(t, n.mustAdd(pod2, "ctr-after", "eth0"))
	al := n.allocations()
	if len(al) != 1 || al[0].ContainerID != "ctr-after" || al[0].Addr != fresh {
		t.Errorf("allocations after a reboot and one ADD: %v, want only ctr-after (%s); %s was from the old boot", al, fresh, old)
	}
}

func TestStatusFollowsNodeConfig(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{noNodeConfig: true})
	err := n.status()
	if code := cniCode(err); code != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), filepath.Join(n.dir, "node.json")) {
		t.Fatalf("STATUS without node config: code %d, %v; want 50 naming the file", code, err)
	}
	pod := newNetNS(t, "pod")
	if _, err := n.add(pod, "ctr-early", "eth0"); cniCode(err) != types.ErrTryAgainLater {
		t.Errorf("ADD without node config: %v, want code 11", err)
	}
	// An invalid node config is named too.
	if err := os.WriteFile(filepath.Join(n.dir, "node.json"), []byte(`{"podCIDR":"10.244.1.7/24"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.status(); cniCode(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "host bits") {
		t.Errorf("STATUS with invalid node config: %v, want code 50 explaining it", err)
	}
	n.writeNodeConfig("10.244.9.0/24", 1450)
	if err := n.status(); err != nil {
		t.Fatalf("STATUS with node config: %v", err)
	}
	n.mustAdd(pod, "ctr-early", "eth0")
}

func TestStaleBridgeAddressIsReplaced(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{podCIDR: "10.244.1.0/24"})
	// cbr0 left from an earlier life of the node with another podCIDR.
	inNS(t, n.ns, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cbr0", TxQLen: -1}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return link.AddAddr(br, netip.MustParsePrefix("10.244.7.1/24"))
	})
	pod := newNetNS(t, "pod")
	n.mustAdd(pod, "ctr-1", "eth0")
	if got := bridgeAddrs(t, n); len(got) != 1 || got[0] != netip.MustParsePrefix("10.244.1.1/24") {
		t.Errorf("cbr0 addresses %v, want only 10.244.1.1/24", got)
	}

	// The podCIDR (and MTU) change while a pod still uses the old range:
	// ADD says so and keeps the old address; after that pod's DEL it succeeds.
	n.writeNodeConfig("10.244.2.0/24", 1400)
	pod2 := newNetNS(t, "pod")
	_, err := n.add(pod2, "ctr-2", "eth0")
	if cniCode(err) != types.ErrTryAgainLater || !strings.Contains(err.Error(), "10.244.1.1/24") || !strings.Contains(err.Error(), "ctr-1") {
		t.Fatalf("ADD with a pod in the old range: %v, want code 11 naming the old address and the pod", err)
	}
	if err := n.del(pod, "ctr-1", "eth0"); err != nil {
		t.Fatal(err)
	}
	r := n.mustAdd(pod2, "ctr-2", "eth0")
	if a := podAddr(t, r); !netip.MustParsePrefix("10.244.2.0/24").Contains(a) {
		t.Errorf("pod address %s outside the new podCIDR", a)
	}
	if got := bridgeAddrs(t, n); len(got) != 1 || got[0] != netip.MustParsePrefix("10.244.2.1/24") {
		t.Errorf("cbr0 addresses %v, want only 10.244.2.1/24", got)
	}
	inNS(t, n.ns, func() error {
		br, err := netlink.LinkByName("cbr0")
		if err == nil && br.Attrs().MTU != 1400 {
			t.Errorf("cbr0 MTU %d after the node MTU changed to 1400", br.Attrs().MTU)
		}
		return err
	})
	if err := ping(pod2, netip.MustParseAddr("10.244.2.1")); err != nil {
		t.Errorf("ping the new gateway: %v", err)
	}
}

func bridgeAddrs(t testing.TB, n *testNode) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	inNS(t, n.ns, func() error {
		br, err := netlink.LinkByName("cbr0")
		if err != nil {
			return err
		}
		out, err = link.Addrs(br, netlink.FAMILY_ALL)
		return err
	})
	return out
}

func TestGCRemovesWhatIsNotValid(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pods := make([]ns.NetNS, 3)
	for i := range pods {
		pods[i] = newNetNS(t, "pod")
		n.mustAdd(pods[i], fmt.Sprintf("ctr-%d", i), "eth0")
	}
	keep := types.GCAttachment{ContainerID: "ctr-1", IfName: "eth0"}
	// A fresh libcni cache: libcni itself DELs nothing, the plugin's GC
	// has to find the stale ones.
	if err := n.gc([]types.GCAttachment{keep}, true); err != nil {
		t.Fatalf("GC: %v", err)
	}
	al := n.allocations()
	if len(al) != 1 || al[0].ContainerID != "ctr-1" {
		t.Errorf("allocations after GC: %v, want only ctr-1", al)
	}
	for i := range pods {
		name := link.HostVethName(fmt.Sprintf("ctr-%d", i), "eth0")
		if want := i == 1; linkExists(t, n.ns, name) != want || linkExists(t, pods[i], "eth0") != want {
			t.Errorf("pod %d: veth exists %v, want %v", i, !want, want)
		}
	}
	if err := n.check(pods[1], "ctr-1", "eth0"); err != nil {
		t.Errorf("CHECK of the valid attachment after GC: %v", err)
	}
}

func TestFailedAddUndoesEverything(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pod := newNetNS(t, "pod")
	// The pod already has an eth0 that is not podnet's: the veth cannot be
	// created after the address was taken.
	inNS(t, pod, func() error {
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eth0", TxQLen: -1}})
	})
	_, err := n.add(pod, "ctr-fail", "eth0")
	if err == nil || !strings.Contains(err.Error(), "already exists in the pod") {
		t.Fatalf("ADD over a foreign eth0: %v, want an error saying it exists", err)
	}
	if al := n.allocations(); len(al) != 0 {
		t.Errorf("failed ADD kept allocations %v", al)
	}
	if linkExists(t, n.ns, link.HostVethName("ctr-fail", "eth0")) {
		t.Error("failed ADD left the host veth")
	}
	inNS(t, pod, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if _, ok := l.(*netlink.Bridge); !ok {
			t.Errorf("the pod's own eth0 was replaced by a %s", l.Type())
		}
		return nil
	})
}

func TestGCContinuesPastErrors(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	pod := newNetNS(t, "pod")
	n.mustAdd(pod, "ctr-stale", "eth0")
	// A store that cannot be read: GC still removes the stale veth and
	// reports the store error.
	store := filepath.Join(n.dir, "ipam", "podnet", "allocations.json")
	if err := os.WriteFile(store, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := n.gc(nil, true)
	if err == nil || !strings.Contains(err.Error(), "allocations.json") {
		t.Errorf("GC with a broken store: %v, want an error naming the store", err)
	}
	if linkExists(t, n.ns, link.HostVethName("ctr-stale", "eth0")) {
		t.Error("GC stopped at the store error and left the stale veth")
	}
}

func TestBridgeNameTakenByAnotherDevice(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{})
	inNS(t, n.ns, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cbr0", TxQLen: -1}, PeerName: "cbr0peer", PeerTxQLen: -1})
	})
	pod := newNetNS(t, "pod")
	_, err := n.add(pod, "ctr-x", "eth0")
	if err == nil || !strings.Contains(err.Error(), "cbr0 exists and is a veth device, not a bridge") {
		t.Fatalf("ADD with cbr0 taken by a veth: %v", err)
	}
	if al := n.allocations(); len(al) != 0 {
		t.Errorf("failed ADD kept allocations %v", al)
	}
	if linkExists(t, pod, "eth0") {
		t.Error("failed ADD left an interface in the pod")
	}
}

// TestDualStackAddCheckDelGC: on a dual-stack node each pod gets one
// address per family from the node's podCIDRs, each with its gateway on
// cbr0 (the IPv6 one usable at once: no DAD), and ignores router
// advertisements; pods reach each other over both families; CHECK
// notices an IPv6 address gone; DEL and GC free both families.
func TestDualStackAddCheckDelGC(t *testing.T) {
	t.Parallel()
	v4, v6 := netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")
	n := newTestNode(t, nodeOptions{podCIDR: v6.String() + "," + v4.String()})
	pods := []ns.NetNS{newNetNS(t, "pod"), newNetNS(t, "pod")}
	var addrs [][]netip.Addr
	for i, pod := range pods {
		r := n.mustAdd(pod, fmt.Sprintf("ctr-%d", i), "eth0")
		var got []netip.Addr
		for _, ipc := range r.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			got = append(got, a.Unmap())
		}
		if len(got) != 2 || !v4.Contains(got[0]) || !v6.Contains(got[1]) ||
			r.IPs[1].Gateway.String() != "fd00:10:244:7::1" || len(r.Routes) != 2 || r.Routes[1].Dst.String() != "::/0" {
			t.Fatalf("pod %d: result IPs %v routes %v; want an IPv4 address of %s, then an IPv6 one of %s via fd00:10:244:7::1", i, r.IPs, r.Routes, v4, v6)
		}
		addrs = append(addrs, got)
		st, err := link.InspectPod(pod, "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if st.AcceptRA != "0" || st.DefaultGW(got[1]) != netip.MustParseAddr("fd00:10:244:7::1") || st.DefaultGW(got[0]) != netip.MustParseAddr("10.244.7.1") {
			t.Errorf("pod %d: accept_ra %q, gateways %v", i, st.AcceptRA, st.Gateways)
		}
	}
	if got := bridgeAddrs(t, n); !slices.Contains(got, netip.MustParsePrefix("fd00:10:244:7::1/64")) || !slices.Contains(got, netip.MustParsePrefix("10.244.7.1/24")) {
		t.Errorf("cbr0 holds %v, want both gateways", got)
	}
	for _, a := range addrs[1] {
		if err := ping(pods[0], a); err != nil {
			t.Errorf("pod 0 -> pod 1 %s: %v", a, err)
		}
	}
	if err := n.check(pods[1], "ctr-1", "eth0"); err != nil {
		t.Errorf("CHECK of an untouched dual-stack pod: %v", err)
	}
	inNS(t, pods[1], func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: addrs[1][1].AsSlice(), Mask: net.CIDRMask(64, 128)}})
	})
	if err := n.check(pods[1], "ctr-1", "eth0"); err == nil || !strings.Contains(err.Error(), addrs[1][1].String()+"/64") {
		t.Errorf("CHECK after the pod's IPv6 address went: %v, want the address named", err)
	}
	if err := n.del(pods[0], "ctr-0", "eth0"); err != nil {
		t.Fatal(err)
	}
	if al := n.allocations(); len(al) != 2 || al[0].ContainerID != "ctr-1" || al[1].ContainerID != "ctr-1" {
		t.Errorf("after DEL of ctr-0: %v, want ctr-1's two addresses", al)
	}
	if err := n.gc(nil, true); err != nil {
		t.Fatal(err)
	}
	if al := n.allocations(); len(al) != 0 {
		t.Errorf("after GC with nothing valid: %v", al)
	}
}
