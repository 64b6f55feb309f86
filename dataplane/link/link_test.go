package link

import (
	"net/netip"
	"testing"
)

func TestHostVethName(t *testing.T) {
	a := HostVethName("0123456789abcdef", "eth0")
	if a != HostVethName("0123456789abcdef", "eth0") {
		t.Error("name is not deterministic")
	}
	if len(a) > 15 || !IsHostVethName(a) {
		t.Errorf("%q: too long or not recognised", a)
	}
	seen := map[string]bool{}
	for _, p := range [][2]string{{"c1", "eth0"}, {"c1", "eth1"}, {"c2", "eth0"}, {"c1e", "th0"}} {
		n := HostVethName(p[0], p[1])
		if seen[n] {
			t.Errorf("%v collides: %s", p, n)
		}
		seen[n] = true
	}
	for _, name := range []string{"eth0", "cbr0", "pnXYZ", "pn0123456789abcd", "veth0123456789a"} {
		if IsHostVethName(name) {
			t.Errorf("%q taken for a podnet veth", name)
		}
	}
}

func TestMACFromIP(t *testing.T) {
	if m := MACFromIP(netip.MustParseAddr("10.244.1.1")).String(); m != "0a:58:0a:f4:01:01" {
		t.Errorf("MAC %s", m)
	}
	m := RandomMAC()
	if m[0]&1 != 0 || m[0]&2 == 0 {
		t.Errorf("random MAC %s is not unicast and locally administered", m)
	}
}
