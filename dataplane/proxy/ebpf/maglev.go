package ebpf

import (
	"hash/fnv"
	"net/netip"

	"github.com/podnet/podnet/bpf"
)

// maglevM is the size of a Maglev lookup table, as bpf/nodeport.c has it
// (MAGLEV_M): a prime. Maglev keeps each backend's share within a few
// per cent of even when M is ~100 times the backend count; 1021 suits
// Services of up to ~10 endpoints at 4 KiB per external Service (Cilium
// uses 16381 at 64 KiB).
const maglevM = len(bpf.NodeportMaglevTable{}.Ids)

type maglevTable = bpf.NodeportMaglevTable

// maglev computes the lookup table of a Service whose backends are eps
// (named by address and port) with ids ids (eps[i] has ids[i]), after
// Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
// Balancer" (NSDI 2016), section 3.4: every backend walks its own
// permutation of the table and claims the next free entry in turn. The
// table depends only on the set of names, so every node computes the same
// one, and adding or removing one backend moves few entries of the others.
func maglev(eps []netip.AddrPort, ids []uint32) maglevTable {
	var t maglevTable
	n := len(eps)
	if n == 0 {
		return t
	}
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	for i, ep := range eps {
		name := ep.String()
		h1, h2 := fnv.New64a(), fnv.New64()
		h1.Write([]byte(name))
		h2.Write([]byte(name))
		offset[i] = h1.Sum64() % uint64(maglevM)
		skip[i] = h2.Sum64()%uint64(maglevM-1) + 1
	}
	// Backends take turns in name order, so the table does not depend on
	// the order eps come in.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sortByName(order, eps)
	filled := make([]bool, maglevM)
	next := make([]uint64, n)
	for claimed := 0; ; {
		for _, i := range order {
			c := (offset[i] + next[i]*skip[i]) % uint64(maglevM)
			for filled[c] {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(maglevM)
			}
			t.Ids[c] = ids[i]
			filled[c] = true
			next[i]++
			if claimed++; claimed == maglevM {
				return t
			}
		}
	}
}

func sortByName(order []int, eps []netip.AddrPort) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && eps[order[j]].Compare(eps[order[j-1]]) < 0; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}
