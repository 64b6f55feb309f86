package ipfamily

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFamilyOfAndPerFamilyValues(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	mapped := netip.MustParseAddr("::ffff:10.0.0.1")
	if Of(v4) != IPv4 || Of(v6) != IPv6 || Of(mapped) != IPv6 || Of(netip.Addr{}) != 0 {
		t.Errorf("Of: %v %v %v %v", Of(v4), Of(v6), Of(mapped), Of(netip.Addr{}))
	}
	if IPv4.Bits() != 32 || IPv6.Bits() != 128 || IPv4.AF() != unix.AF_INET || IPv6.AF() != unix.AF_INET6 {
		t.Errorf("Bits/AF: %d %d %d %d", IPv4.Bits(), IPv6.Bits(), IPv4.AF(), IPv6.AF())
	}
	if IPv4.Loopback().String() != "127.0.0.0/8" || IPv6.Loopback().String() != "::1/128" {
		t.Errorf("Loopback: %v %v", IPv4.Loopback(), IPv6.Loopback())
	}
	if IPv4.Any().String() != "0.0.0.0/0" || IPv6.Any().String() != "::/0" {
		t.Errorf("Any: %v %v", IPv4.Any(), IPv6.Any())
	}
	if Host(v4).String() != "10.0.0.1/32" || Host(v6).String() != "fd00::1/128" {
		t.Errorf("Host: %v %v", Host(v4), Host(v6))
	}
	if got := IPv6.Addrs([]netip.Addr{v4, v6, {}}); len(got) != 1 || got[0] != v6 {
		t.Errorf("IPv6.Addrs = %v", got)
	}
	ps := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}
	if got := IPv4.Prefixes(ps); len(got) != 1 || got[0] != ps[0] {
		t.Errorf("IPv4.Prefixes = %v", got)
	}
	for _, s := range []string{"IPv4", "IPv6"} {
		if f, err := Parse(s); err != nil || f.String() != s {
			t.Errorf("Parse(%s) = %v, %v", s, f, err)
		}
	}
	if _, err := Parse("ipv4"); err == nil {
		t.Error("Parse(ipv4): no error")
	}
}

func TestBitsAtAndSubnet(t *testing.T) {
	a4, a6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")
	if got := BitsAt(a4, 0, 32); got != 0x0a60000a {
		t.Errorf("BitsAt(v4, 0, 32) = %#x", got)
	}
	if got := BitsAt(a4, 8, 4); got != 0x6 {
		t.Errorf("BitsAt(v4, 8, 4) = %#x", got)
	}
	if got := BitsAt(a6, 0, 32); got != 0xfd000096 {
		t.Errorf("BitsAt(v6, 0, 32) = %#x", got)
	}
	if got := BitsAt(a6, 124, 4); got != 0xa {
		t.Errorf("BitsAt(v6, 124, 4) = %#x", got)
	}
	for _, c := range []struct {
		p    string
		bits int
		i    uint64
		want string
	}{
		{"10.244.0.0/16", 24, 0, "10.244.0.0/24"},
		{"10.244.0.0/16", 24, 3, "10.244.3.0/24"},
		{"10.244.0.0/16", 24, 255, "10.244.255.0/24"},
		{"10.0.0.0/8", 26, 5, "10.0.1.64/26"},
		{"fd00:244::/48", 64, 0, "fd00:244::/64"},
		{"fd00:244::/48", 64, 3, "fd00:244:0:3::/64"},
		{"fd00:244::/48", 64, 0xffff, "fd00:244:0:ffff::/64"},
		{"fd00::/56", 60, 0x9, "fd00:0:0:90::/60"},
		{"fd00::/8", 120, 0x1ff, "fd00::1:ff00/120"},
	} {
		got, ok := Subnet(netip.MustParsePrefix(c.p), c.bits, c.i)
		if !ok || got.String() != c.want {
			t.Errorf("Subnet(%s, %d, %d) = %v, %v; want %s", c.p, c.bits, c.i, got, ok, c.want)
		}
	}
	if _, ok := Subnet(netip.MustParsePrefix("10.244.0.0/16"), 24, 256); ok {
		t.Error("Subnet past the end: ok")
	}
	if _, ok := Subnet(netip.MustParsePrefix("10.244.0.0/16"), 8, 0); ok {
		t.Error("Subnet larger than the prefix: ok")
	}
}

func TestParsePrefixes(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"10.244.0.0/16", "[10.244.0.0/16]", ""},
		{"fd00:10:244::/56", "[fd00:10:244::/56]", ""},
		{"10.244.0.0/16, fd00:10:244::/56", "[10.244.0.0/16 fd00:10:244::/56]", ""},
		{"fd00:10:244::/56,10.244.0.0/16", "[fd00:10:244::/56 10.244.0.0/16]", ""},
		{"10.244.1.7/16", "[10.244.0.0/16]", ""},
		{"", "", "an empty entry"},
		{"10.244.0.0/16,", "", "an empty entry"},
		{"10.244.0.0/16,10.245.0.0/16", "", "10.244.0.0/16 and 10.245.0.0/16 are both IPv4"},
		{"10.244.0.0/16,fd00::/56,fd01::/56", "", "fd00::/56 and fd01::/56 are both IPv6"},
		{"10.244.0.0", "", `"10.244.0.0" is not a prefix`},
	} {
		got, err := ParsePrefixes(c.in)
		switch {
		case c.err == "" && (err != nil || fmt.Sprint(got) != c.want):
			t.Errorf("ParsePrefixes(%q) = %v, %v; want %s", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParsePrefixes(%q) = %v, %v; want an error containing %q", c.in, got, err, c.err)
		}
	}
}
