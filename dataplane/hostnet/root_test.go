package hostnet

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestRealIPTablesAndSysctls runs against a fresh network namespace: the
// chains come out as designed, a second pass changes nothing (iptables -C
// agrees with how the rules were written), and removal leaves no trace.
func TestRealIPTablesAndSysctls(t *testing.T) {
	roottest.Require(t)
	name, netns := roottest.NetNS(t, "podnet-hn")

	err := netns.Do(func(ns.NetNS) error {
		if err := EnsureSysctls(ProcSysctl{}, ExecModprobe); err != nil {
			return err
		}
		if v, _ := (ProcSysctl{}).Get(sysctlForward); v != "1" {
			return fmt.Errorf("ip_forward = %q", v)
		}
		ipt, err := iptables.New()
		if err != nil {
			return err
		}
		if changed, err := EnsureChains(ipt, rules); err != nil || !changed {
			return fmt.Errorf("first ensure: changed %v, err %v", changed, err)
		}
		if changed, err := EnsureChains(ipt, rules); err != nil || changed {
			return fmt.Errorf("second ensure: changed %v, err %v", changed, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	save, _ := exec.Command("ip", "netns", "exec", name, "iptables-save").CombinedOutput()
	for _, want := range []string{
		"-A POSTROUTING -m comment --comment podnet -j PODNET-POSTROUTING",
		"-A PODNET-POSTROUTING -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment \"podnet: pods to outside the cluster\" -j MASQUERADE --random-fully",
		"-A FORWARD -m comment --comment podnet -j PODNET-FORWARD",
		"-A PODNET-FORWARD -d 10.244.0.0/16 -m comment --comment \"podnet: to pods\" -j ACCEPT",
	} {
		if !strings.Contains(string(save), want) {
			t.Errorf("iptables-save lacks %q:\n%s", want, save)
		}
	}
	err = netns.Do(func(ns.NetNS) error {
		ipt, err := iptables.New()
		if err != nil {
			return err
		}
		return RemoveChains(ipt)
	})
	if err != nil {
		t.Fatal(err)
	}
	save, _ = exec.Command("ip", "netns", "exec", name, "iptables-save").CombinedOutput()
	if strings.Contains(string(save), "PODNET") {
		t.Errorf("chains left after removal:\n%s", save)
	}
}

// TestRealIP6TablesAndSysctls: in a fresh network namespace, a dual-stack
// node's sysctls (IPv6 forwarding, br_netfilter's IPv6 hook) are set and
// read back, and ip6tables holds the IPv6 masquerade; removal leaves none.
func TestRealIP6TablesAndSysctls(t *testing.T) {
	roottest.Require(t)
	roottest.Tool(t, "ip6tables-save", "iptables")
	name, netns := roottest.NetNS(t, "podnet-hn6")
	v6 := Rules{ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56"), Masquerade: true}
	err := netns.Do(func(ns.NetNS) error {
		if err := EnsureSysctls(ProcSysctl{}, ExecModprobe, ipfamily.IPv4, ipfamily.IPv6); err != nil {
			return err
		}
		for _, f := range ipfamily.All {
			fwd, nf := Sysctls(f)
			for _, k := range []string{fwd, nf} {
				if v, err := (ProcSysctl{}).Get(k); v != "1" {
					return fmt.Errorf("%s = %q (%v), want 1", k, v, err)
				}
			}
		}
		ipt, err := iptables.NewWithProtocol(iptables.ProtocolIPv6)
		if err != nil {
			return err
		}
		if changed, err := EnsureChains(ipt, v6); err != nil || !changed {
			return fmt.Errorf("first ensure: changed %v, err %v", changed, err)
		}
		if changed, err := EnsureChains(ipt, v6); err != nil || changed {
			return fmt.Errorf("second ensure: changed %v, err %v", changed, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	save, _ := exec.Command("ip", "netns", "exec", name, "ip6tables-save").CombinedOutput()
	want := "-A PODNET-POSTROUTING -s fd00:10:244::/56 ! -d ff00::/8 -m comment --comment \"podnet: pods to outside the cluster\" -j MASQUERADE --random-fully"
	if !strings.Contains(string(save), want) {
		t.Errorf("ip6tables-save lacks %q:\n%s", want, save)
	}
	err = netns.Do(func(ns.NetNS) error {
		ipt, err := iptables.NewWithProtocol(iptables.ProtocolIPv6)
		if err != nil {
			return err
		}
		return RemoveChains(ipt)
	})
	if err != nil {
		t.Fatal(err)
	}
	save, _ = exec.Command("ip", "netns", "exec", name, "ip6tables-save").CombinedOutput()
	if strings.Contains(string(save), "PODNET") {
		t.Errorf("chains left after removal:\n%s", save)
	}
}
