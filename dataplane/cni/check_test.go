package cni

import (
	"errors"
	"net/netip"
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
		addr: netip.MustParseAddr("10.244.1.5"), prefix: netip.MustParsePrefix("10.244.1.5/24"),
		gw: netip.MustParseAddr("10.244.1.1"), mac: "0a:58:0a:f4:01:05",
		podCIDR: netip.MustParsePrefix("10.244.1.0/24"), mtu: 1450, bridge: "cbr0", hostVeth: "veth1234",
	}
	good := checkSeen{
		ipamAddr: want.addr, hostMaster: 7, bridgeIndex: 7, hostMTU: 1450, hostUp: true,
		pod: link.PodState{MTU: 1450, MAC: "0A:58:0A:F4:01:05", Up: true,
			Addrs: []netip.Prefix{netip.MustParsePrefix("fe80::1/64"), want.prefix}, DefaultGW: want.gw},
	}
	if d := compareCheck(want, good); len(d) != 0 {
		t.Fatalf("a pod as ADD left it: %q", d)
	}
	tests := []struct {
		name   string
		change func(*checkWant, *checkSeen)
		diff   string
	}{
		{"no ipam entry", func(_ *checkWant, s *checkSeen) { s.ipamAddr = netip.Addr{} }, "ipam holds no address for ctr/eth0"},
		{"other ipam entry", func(_ *checkWant, s *checkSeen) { s.ipamAddr = netip.MustParseAddr("10.244.1.6") }, "ipam holds 10.244.1.6"},
		{"outside podCIDR", func(w *checkWant, _ *checkSeen) { w.podCIDR = netip.MustParsePrefix("10.244.2.0/24") }, "outside the podCIDR 10.244.2.0/24"},
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
		{"other gateway", func(_ *checkWant, s *checkSeen) { s.pod.DefaultGW = netip.MustParseAddr("10.244.1.254") }, "default route is via 10.244.1.254, want 10.244.1.1"},
		{"no gateway", func(_ *checkWant, s *checkSeen) { s.pod.DefaultGW = netip.Addr{} }, "pod has no default route via 10.244.1.1 on eth0"},
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
	w.mac, w.gw = "", netip.Addr{}
	s.pod.MAC, s.pod.DefaultGW = "ff:ff:ff:ff:ff:ff", netip.Addr{}
	if d := compareCheck(w, s); len(d) != 0 {
		t.Errorf("without MAC and gateway in prevResult: %q", d)
	}
}
