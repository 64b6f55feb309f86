package nftmsg

import (
	"slices"
	"testing"

	"github.com/google/nftables"
)

// TestSplitElements: lists stay under MaxElemBytes by the bound Split
// counts, an interval's end never starts a list, and the lists together
// are the input in order.
func TestSplitElements(t *testing.T) {
	var elems []nftables.SetElement
	for i := range 9000 {
		e := nftables.SetElement{Key: make([]byte, 16), IntervalEnd: i%2 == 1}
		e.Key[15], e.Key[14] = byte(i), byte(i>>8)
		elems = append(elems, e)
	}
	parts := SplitElements(elems)
	if len(parts) < 2 {
		t.Fatalf("%d elements of 80 bytes in %d list(s), want several", len(elems), len(parts))
	}
	var joined []nftables.SetElement
	for i, p := range parts {
		if n := len(p) * (64 + 16); n > MaxElemBytes {
			t.Errorf("list %d: %d bytes, over %d", i, n, MaxElemBytes)
		}
		if p[0].IntervalEnd {
			t.Errorf("list %d starts with an interval's end", i)
		}
		joined = append(joined, p...)
	}
	if !slices.EqualFunc(joined, elems, func(a, b nftables.SetElement) bool { return slices.Equal(a.Key, b.Key) }) {
		t.Error("the lists together are not the input")
	}
	if got := SplitElements(nil); len(got) != 0 {
		t.Errorf("no elements made %d lists", len(got))
	}
}
