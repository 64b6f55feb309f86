package ebpf

import (
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
	var buf [64]byte
	for i, ep := range eps {
		name := ep.AppendTo(buf[:0])
		h1, h2 := fnv64(name)
		offset[i] = h1 % uint64(maglevM)
		skip[i] = h2%uint64(maglevM-1) + 1
	}
	// Backends take turns in name order, so the table does not depend on
	// the order eps come in.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sortByName(order, eps)
	// pos[i] is entry next of backend i's permutation, offset + next*skip
	// mod M, stepped by adding skip (< M) rather than computed with a
	// division each time.
	var filled [maglevM]bool
	pos := offset
	step := func(i int) uint64 {
		c := pos[i]
		if pos[i] += skip[i]; pos[i] >= uint64(maglevM) {
			pos[i] -= uint64(maglevM)
		}
		return c
	}
	for claimed := 0; ; {
		for _, i := range order {
			c := step(i)
			for filled[c] {
				c = step(i)
			}
			t.Ids[c] = ids[i]
			filled[c] = true
			if claimed++; claimed == maglevM {
				return t
			}
		}
	}
}

// fnv64 is FNV-1a and FNV-1 (64 bits) of b, as hash/fnv computes them,
// without the allocations of two hash.Hash64 per backend.
func fnv64(b []byte) (fnv1a, fnv1 uint64) {
	const offset, prime = 14695981039346656037, 1099511628211
	fnv1a, fnv1 = offset, offset
	for _, c := range b {
		fnv1a = (fnv1a ^ uint64(c)) * prime
		fnv1 = fnv1*prime ^ uint64(c)
	}
	return fnv1a, fnv1
}

func sortByName(order []int, eps []netip.AddrPort) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && eps[order[j]].Compare(eps[order[j-1]]) < 0; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}
