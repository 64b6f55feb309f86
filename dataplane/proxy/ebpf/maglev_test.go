package ebpf

import (
	"fmt"
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
