// Package ipfamily names an address family, IPv4 or IPv6, as data. Code
// that handles addresses takes the family as a parameter (or holds one value
// per family) instead of assuming IPv4; what genuinely differs between the
// two (address width, the kernel's AF_ constant, loopback) is answered here,
// in one per-family switch, so no other package needs `To4`, `/32` or
// `AF_INET` literals.
package ipfamily

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"
)

// Family is an IP address family. The zero Family is no family.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// All lists both families, IPv4 first.
var All = []Family{IPv4, IPv6}

// Of returns the family of a (an IPv4-mapped IPv6 address is IPv6); 0 for
// the zero Addr.
func Of(a netip.Addr) Family {
	switch {
	case a.Is4():
		return IPv4
	case a.Is6():
		return IPv6
	}
	return 0
}

// OfPrefix returns the family of p's address.
func OfPrefix(p netip.Prefix) Family { return Of(p.Addr()) }

// Parse reads "IPv4" or "IPv6" (Kubernetes' spelling of ipFamilies).
func Parse(s string) (Family, error) {
	switch s {
	case "IPv4":
		return IPv4, nil
	case "IPv6":
		return IPv6, nil
	}
	return 0, fmt.Errorf("address family %q: want IPv4 or IPv6", s)
}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", uint8(f))
}

// Valid reports whether f is IPv4 or IPv6.
func (f Family) Valid() bool { return f == IPv4 || f == IPv6 }

// Bits is the width of an address of the family: 32 or 128.
func (f Family) Bits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}

// Has reports whether a is of family f.
func (f Family) Has(a netip.Addr) bool { return a.IsValid() && Of(a) == f }

// HasPrefix reports whether p is of family f.
func (f Family) HasPrefix(p netip.Prefix) bool { return p.IsValid() && Of(p.Addr()) == f }

// AF is the kernel's address family constant (AF_INET, AF_INET6).
func (f Family) AF() int {
	if f == IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// Loopback is the family's loopback network: 127.0.0.0/8 or ::1/128.
func (f Family) Loopback() netip.Prefix {
	if f == IPv6 {
		return netip.PrefixFrom(netip.IPv6Loopback(), 128)
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127}), 8)
}

// Any is the prefix holding every address of the family: 0.0.0.0/0 or ::/0.
func (f Family) Any() netip.Prefix {
	if f == IPv6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

// Host is the prefix holding a alone: a/32 or a/128.
func Host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Addrs returns the addresses of as that are of family f, in order.
func (f Family) Addrs(as []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if f.Has(a) {
			out = append(out, a)
		}
	}
	return out
}

// Prefixes returns the prefixes of ps that are of family f, in order.
func (f Family) Prefixes(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.HasPrefix(p) {
			out = append(out, p)
		}
	}
	return out
}

// BitsAt returns n (at most 64) bits of a starting at bit from (0 is the
// most significant), as the low bits of the result: the one place podnet
// reads an address as a number, for IPv4 and IPv6 alike.
func BitsAt(a netip.Addr, from, n int) uint64 {
	if n == 0 {
		return 0
	}
	b := a.As16()
	if a.Is4() {
		from += 96 // As16 holds an IPv4 address in its last 32 bits
	}
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var top uint64 // the 64 bits starting at from
	switch {
	case from == 0:
		top = hi
	case from < 64:
		top = hi<<from | lo>>(64-from)
	default:
		top = lo << (from - 64)
	}
	return top >> (64 - n)
}

// Subnet returns the i-th subnet of length bits inside p, or false when p
// holds fewer than i+1 of them.
func Subnet(p netip.Prefix, bits int, i uint64) (netip.Prefix, bool) {
	width := p.Addr().BitLen()
	if bits < p.Bits() || bits > width || bits-p.Bits() < 64 && i>>(bits-p.Bits()) != 0 {
		return netip.Prefix{}, false
	}
	b := p.Masked().Addr().AsSlice()
	// Add i at bit position bits-1 (counting from the most significant),
	// carrying towards the front.
	shift := width - bits
	carry := uint64(0)
	for k := len(b) - 1; k >= 0; k-- {
		lo := (len(b) - 1 - k) * 8 // bit offset of byte k from the right
		var add uint64
		if lo+8 > shift && lo-shift < 64 {
			if lo >= shift {
				add = i >> (lo - shift) & 0xff
			} else {
				add = i << (shift - lo) & 0xff
			}
		}
		sum := uint64(b[k]) + add + carry
		b[k], carry = byte(sum), sum>>8
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, bits), true
}

// ParsePrefixes reads a comma-separated list of prefixes with at most one
// per family, as Kubernetes' dual-stack flags (--cluster-cidr,
// --service-cluster-ip-range) take them: "10.244.0.0/16",
// "fd00:10:244::/56" or "10.244.0.0/16,fd00:10:244::/56". Host bits are
// masked off. The error names the part that is wrong.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("%q: an empty entry; want one prefix per family, separated by a comma", s)
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a prefix like 10.244.0.0/16 or fd00:10:244::/56", s, part)
		}
		p = p.Masked()
		for _, q := range out {
			if OfPrefix(q) == OfPrefix(p) {
				return nil, fmt.Errorf("%q: %s and %s are both %v; want at most one prefix per family", s, q, p, OfPrefix(p))
			}
		}
		out = append(out, p)
	}
	return out, nil
}
