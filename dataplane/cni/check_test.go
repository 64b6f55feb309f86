package cni

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/link"
)

// TestCompareCheck: CHECK's comparison on its own, without root: a pod as
// ADD left it passes, and each way it can drift is named.
func TestCompareCheck(t *testing.T) {
	want := checkWant{
		att: ipam.Attachment{ContainerID: "ctr", IfName: "eth0"}, ifName: "eth0",
		addrs: []wantAddr{{addr: netip.MustParseAddr("10.244.1.5"), prefix: netip.MustParsePrefix("10.244.1.5/24"),
			gw: netip.MustParseAddr("10.244.1.1")}}, mac: "0a:58:0a:f4:01:05",
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, mtu: 1450, bridge: "cbr0", hostVeth: "veth1234",
	}
	good := checkSeen{
		ipamAddrs: []netip.Addr{want.addrs[0].addr}, hostMaster: 7, bridgeIndex: 7, hostMTU: 1450, hostUp: true,
		pod: link.PodState{MTU: 1450, MAC: "0A:58:0A:F4:01:05", Up: true,
			Addrs: []netip.Prefix{netip.MustParsePrefix("fe80::1/64"), want.addrs[0].prefix}, Gateways: []netip.Addr{want.addrs[0].gw}},
	}
	if d := compareCheck(want, good); len(d) != 0 {
		t.Fatalf("a pod as ADD left it: %q", d)
	}
	tests := []struct {
		name   string
		change func(*checkWant, *checkSeen)
		diff   string
	}{
		{"no ipam entry", func(_ *checkWant, s *checkSeen) { s.ipamAddrs = nil }, "ipam holds no IPv4 address for ctr/eth0"},
		{"other ipam entry", func(_ *checkWant, s *checkSeen) { s.ipamAddrs = []netip.Addr{netip.MustParseAddr("10.244.1.6")} }, "ipam holds 10.244.1.6"},
		{"outside podCIDR", func(w *checkWant, _ *checkSeen) { w.podCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")} }, "outside the podCIDR [10.244.2.0/24]"},
		{"no host veth", func(_ *checkWant, s *checkSeen) { s.hostErr = errors.New("Link not found") }, "host veth veth1234: Link not found"},
		{"no bridge", func(_ *checkWant, s *checkSeen) { s.bridgeErr = errors.New("Link not found") }, "bridge cbr0: Link not found"},
		{"detached", func(_ *checkWant, s *checkSeen) { s.hostMaster = 0 }, "host veth veth1234 is not attached to cbr0"},
		{"host MTU", func(_ *checkWant, s *checkSeen) { s.hostMTU = 1500 }, "host veth veth1234 has MTU 1500, want 1450"},
		{"host down", func(_ *checkWant, s *checkSeen) { s.hostUp = false }, "host veth veth1234 is down"},
		{"pod unreadable", func(_ *checkWant, s *checkSeen) { s.podErr = errors.New("eth0 in pod: not found") }, "eth0 in pod: not found"},
		{"pod MTU", func(_ *checkWant, s *checkSeen) { s.pod.MTU = 9000 }, "eth0 in pod has MTU 9000, want 1450"},
		{"pod MAC", func(_ *checkWant, s *checkSeen) { s.pod.MAC = "0a:58:0a:f4:01:06" }, "has MAC 0a:58:0a:f4:01:06, prevResult has 0a:58:0a:f4:01:05"},
		{"pod down", func(_ *checkWant, s *checkSeen) { s.pod.Up = false }, "eth0 in pod is down"},
		{"pod address", func(_ *checkWant, s *checkSeen) { s.pod.Addrs = nil }, "eth0 in pod has addresses [], want 10.244.1.5/24"},
		{"other gateway", func(_ *checkWant, s *checkSeen) { s.pod.Gateways = []netip.Addr{netip.MustParseAddr("10.244.1.254")} }, "default route is via 10.244.1.254, want 10.244.1.1"},
		{"no gateway", func(_ *checkWant, s *checkSeen) { s.pod.Gateways = nil }, "pod has no default route via 10.244.1.1 on eth0"},
	}
	for _, tt := range tests {
		w, s := want, good
		s.pod.Addrs = append([]netip.Prefix(nil), good.pod.Addrs...)
		tt.change(&w, &s)
		d := compareCheck(w, s)
		if len(d) != 1 || !strings.Contains(d[0], tt.diff) {
			t.Errorf("%s: diffs %q, want one containing %q", tt.name, d, tt.diff)
		}
	}
	// No MAC or gateway in prevResult: not compared.
	w, s := want, good
	w.mac, w.addrs = "", []wantAddr{{addr: want.addrs[0].addr, prefix: want.addrs[0].prefix}}
	s.pod.MAC, s.pod.Gateways = "ff:ff:ff:ff:ff:ff", nil
	if d := compareCheck(w, s); len(d) != 0 {
		t.Errorf("without MAC and gateway in prevResult: %q", d)
	}
}

// TestCompareCheckPerFamily: a dual-stack pod is checked family by family:
// each drift names its family's address, and an IPv6 interface that
// accepts router advertisements is one.
func TestCompareCheckPerFamily(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:10:244:1::5")
	want := checkWant{
		att: ipam.Attachment{ContainerID: "ctr", IfName: "eth0"}, ifName: "eth0",
		addrs: []wantAddr{
			{addr: v4, prefix: netip.PrefixFrom(v4, 24), gw: netip.MustParseAddr("10.244.1.1")},
			{addr: v6, prefix: netip.PrefixFrom(v6, 64), gw: netip.MustParseAddr("fd00:10:244:1::1")},
		},
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		mtu:      1450, bridge: "cbr0", hostVeth: "veth1234",
	}
	good := checkSeen{
		ipamAddrs: []netip.Addr{v4, v6}, hostMaster: 7, bridgeIndex: 7, hostMTU: 1450, hostUp: true,
		pod: link.PodState{MTU: 1450, Up: true, AcceptRA: "0",
			Addrs:    []netip.Prefix{want.addrs[0].prefix, want.addrs[1].prefix},
			Gateways: []netip.Addr{want.addrs[0].gw, want.addrs[1].gw}},
	}
	if d := compareCheck(want, good); len(d) != 0 {
		t.Fatalf("a dual-stack pod as ADD left it: %q", d)
	}
	tests := []struct {
		name   string
		change func(*checkWant, *checkSeen)
		diff   string
	}{
		{"IPv6 ipam entry gone", func(_ *checkWant, s *checkSeen) { s.ipamAddrs = []netip.Addr{v4} }, "ipam holds no IPv6 address for ctr/eth0 (prevResult has fd00:10:244:1::5)"},
		{"IPv6 address gone", func(_ *checkWant, s *checkSeen) { s.pod.Addrs = s.pod.Addrs[:1] }, "want fd00:10:244:1::5/64"},
		{"IPv6 route gone", func(_ *checkWant, s *checkSeen) { s.pod.Gateways = s.pod.Gateways[:1] }, "no default route via fd00:10:244:1::1"},
		{"accept_ra on", func(_ *checkWant, s *checkSeen) { s.pod.AcceptRA = "1" }, "accepts router advertisements"},
		{"IPv6 outside its podCIDR", func(w *checkWant, _ *checkSeen) {
			w.podCIDRs = []netip.Prefix{w.podCIDRs[0], netip.MustParsePrefix("fd00:10:244:2::/64")}
		}, "fd00:10:244:1::5 is outside the podCIDR [fd00:10:244:2::/64]"},
		{"one family missing from prevResult", func(w *checkWant, _ *checkSeen) { w.addrs = w.addrs[:1] }, "prevResult has 1 addresses"},
	}
	for _, tt := range tests {
		w, s := want, good
		w.addrs, w.podCIDRs = slices.Clone(want.addrs), slices.Clone(want.podCIDRs)
		s.ipamAddrs, s.pod.Addrs, s.pod.Gateways = slices.Clone(good.ipamAddrs), slices.Clone(good.pod.Addrs), slices.Clone(good.pod.Gateways)
		tt.change(&w, &s)
		d := compareCheck(w, s)
		if len(d) != 1 || !strings.Contains(d[0], tt.diff) {
			t.Errorf("%s: diffs %q, want one containing %q", tt.name, d, tt.diff)
		}
	}
}
