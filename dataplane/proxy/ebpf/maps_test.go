package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/dataplane/roottest"
)

// TestEachReadsEveryEntry: a kernel map's entries are all read, once,
// whatever the number of batches and as the read buffers grow (values of
// 4 KiB, as Maglev tables: 16 a read at first, up to 256).
func TestEachReadsEveryEntry(t *testing.T) {
	roottest.Require(t)
	type table [512]uint64
	for _, n := range []int{0, 1, 16, 17, 1000} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4096, MaxEntries: uint32(max(n, 1))})
		if err != nil {
			t.Fatal(err)
		}
		tbl := kernelTable[uint32, table]{m}
		keys, vals := make([]uint32, n), make([]table, n)
		for i := range n {
			keys[i], vals[i][511] = uint32(i), uint64(i)*3
		}
		if err := tbl.Put(keys, vals); err != nil {
			t.Fatal(err)
		}
		seen := make(map[uint32]bool)
		err = tbl.Each(func(k uint32, v table) {
			if seen[k] || v[511] != uint64(k)*3 {
				t.Errorf("%d entries: key %d read twice or with value %d", n, k, v[511])
			}
			seen[k] = true
		})
		m.Close()
		if err != nil || len(seen) != n {
			t.Errorf("%d entries: read %d, err %v", n, len(seen), err)
		}
	}
}
