package apiserver

import (
	"net/netip"
	"testing"
)

func TestSeedClusterIP(t *testing.T) {
	for _, c := range []struct {
		prefix string
		i      int
		want   string // "" for an error
	}{
		{"10.96.0.0/12", 0, "10.97.0.1"},
		{"10.96.0.0/12", 9999, "10.97.39.16"},
		{"10.96.0.0/12", 255, "10.97.1.0"},
		{"10.96.0.0/16", 65534, ""}, // 10.97.0.255 is outside
		{"fd00:10:96::/108", 0, "fd00:10:96::1:1"},
		{"fd00:10:96::/108", 9999, "fd00:10:96::1:2710"},
		{"fd00:10:96::/112", 0, ""},
	} {
		got, err := SeedClusterIP(netip.MustParsePrefix(c.prefix), c.i)
		if c.want == "" {
			if err == nil {
				t.Errorf("SeedClusterIP(%s, %d) = %s, want an error", c.prefix, c.i, got)
			}
			continue
		}
		if err != nil || got != netip.MustParseAddr(c.want) {
			t.Errorf("SeedClusterIP(%s, %d) = %v, %v; want %s", c.prefix, c.i, got, err, c.want)
		}
	}
}

func TestAddrAddStopsAtTheFamilysEnd(t *testing.T) {
	for _, c := range []struct {
		a   string
		off uint64
		ok  bool
	}{
		{"255.255.255.254", 1, true},
		{"255.255.255.255", 1, false},
		{"0.0.0.0", 1 << 32, false},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", 1, true},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, false},
		{"::ffff:255.255.255.255", 1, true}, // an IPv6 address like any other
	} {
		got, ok := addrAdd(netip.MustParseAddr(c.a), c.off)
		if ok != c.ok {
			t.Errorf("addrAdd(%s, %d) = %v, %v; want ok %v", c.a, c.off, got, ok, c.ok)
		}
		if ok && got.Is4() != netip.MustParseAddr(c.a).Is4() {
			t.Errorf("addrAdd(%s, %d) = %v: family changed", c.a, c.off, got)
		}
	}
}
