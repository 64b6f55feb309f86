package ebpf

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"testing"
)

func maglevEPs(n int) ([]netip.AddrPort, []uint32) {
	var eps []netip.AddrPort
	var ids []uint32
	for i := range n {
		eps = append(eps, netip.MustParseAddrPort(fmt.Sprintf("10.244.%d.%d:8080", i%3, 2+i)))
		ids = append(ids, uint32(100+i))
	}
	return eps, ids
}

// Each backend gets its share of the table, whatever order the endpoints
// come in, and removing one moves (almost) only its entries.
func TestMaglev(t *testing.T) {
	eps, ids := maglevEPs(10)
	tab := maglev(eps, ids)
	count := map[uint32]int{}
	for _, id := range tab.Ids {
		count[id]++
	}
	for _, id := range ids {
		if c := count[id]; c < maglevM/10*9/10 || c > maglevM/10*11/10 {
			t.Errorf("backend %d holds %d of %d entries, want %d ± 10%%", id, c, maglevM, maglevM/10)
		}
	}
	// Reversed input, same table.
	rev, revIDs := make([]netip.AddrPort, len(eps)), make([]uint32, len(ids))
	for i := range eps {
		rev[len(eps)-1-i], revIDs[len(ids)-1-i] = eps[i], ids[i]
	}
	if maglev(rev, revIDs) != tab {
		t.Error("the table depends on the order of the endpoints")
	}
	// Without backend 3, entries of the others mostly stay.
	less := maglev(append(eps[:3:3], eps[4:]...), append(ids[:3:3], ids[4:]...))
	moved := 0
	for i, id := range tab.Ids {
		if id != ids[3] && less.Ids[i] != id {
			moved++
		}
	}
	if moved > maglevM/20 {
		t.Errorf("removing one of 10 backends moved %d of the others' %d entries, want few", moved, maglevM-count[ids[3]])
	}
	for _, id := range less.Ids {
		if id == ids[3] {
			t.Fatal("the removed backend is still in the table")
		}
	}
}

// fnv64 is hash/fnv's FNV-1a and FNV-1: every node must compute the same
// tables, older proxyds included.
func TestFNV64(t *testing.T) {
	for _, name := range []string{"", "10.244.1.2:8080", "[fd00::1]:53"} {
		a, b := fnv.New64a(), fnv.New64()
		a.Write([]byte(name))
		b.Write([]byte(name))
		if h1, h2 := fnv64([]byte(name)); h1 != a.Sum64() || h2 != b.Sum64() {
			t.Errorf("fnv64(%q) = %x, %x; hash/fnv %x, %x", name, h1, h2, a.Sum64(), b.Sum64())
		}
	}
}

func BenchmarkMaglev(b *testing.B) {
	eps, ids := maglevEPs(10)
	for b.Loop() {
		maglev(eps, ids)
	}
}

// The tables are those earlier proxyds computed (a weighted sum of the
// entries, and the first eight): nodes of two versions side by side still
// send a flow to the same backend.
func TestMaglevStable(t *testing.T) {
	for _, g := range []struct {
		n     int
		sum   uint64
		first [8]uint32
	}{
		{1, 52173100, [8]uint32{100, 100, 100, 100, 100, 100, 100, 100}},
		{2, 52427913, [8]uint32{101, 101, 101, 100, 101, 101, 101, 100}},
		{3, 52686527, [8]uint32{101, 101, 102, 100, 102, 101, 101, 102}},
		{10, 54501742, [8]uint32{106, 106, 104, 106, 107, 106, 106, 106}},
		{37, 61692059, [8]uint32{106, 116, 106, 106, 107, 113, 130, 106}},
	} {
		tab := maglev(maglevEPs(g.n))
		var sum uint64
		for i, id := range tab.Ids {
			sum += uint64(i+1) * uint64(id)
		}
		if sum != g.sum || [8]uint32(tab.Ids[:8]) != g.first {
			t.Errorf("%d backends: sum %d, first %v; want %d, %v", g.n, sum, tab.Ids[:8], g.sum, g.first)
		}
	}
}
