package link

import (
	"net/netip"
	"testing"
)

func TestHolding(t *testing.T) {
	ifcs := []Interface{
		{Name: "lo", MTU: 65536, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")}},
		{Name: "eth0", MTU: 9000, Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/16"), netip.MustParsePrefix("fd00:10::11/64")}},
	}
	for _, c := range []struct {
		iface, ip string
		want      string
		prefix    string
	}{
		{"", "10.0.0.5", "eth0", "10.0.0.5/16"},
		{"", "fd00:10::11", "eth0", "fd00:10::11/64"},
		{"eth0", "10.0.0.5", "eth0", "10.0.0.5/16"},
		{"lo", "10.0.0.5", "", ""},
		{"", "10.0.0.6", "", ""},
	} {
		ifc, p, ok := Holding(ifcs, c.iface, netip.MustParseAddr(c.ip))
		if ifc.Name != c.want || ok != (c.want != "") || (ok && p.String() != c.prefix) {
			t.Errorf("Holding(%q, %s) = %s %v %v, want %s %s", c.iface, c.ip, ifc.Name, p, ok, c.want, c.prefix)
		}
	}
	if _, _, ok := Holding(ifcs, "", netip.Addr{}); ok {
		t.Error("Holding(invalid address) found one")
	}
}

// TestInterfacesListsLoopback reads this namespace's interfaces: every
// network namespace has lo, and a process may read its own without root.
func TestInterfacesListsLoopback(t *testing.T) {
	ifcs, err := Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifcs {
		if ifc.Name == "lo" {
			return
		}
	}
	t.Errorf("no lo among %v", ifcs)
}
