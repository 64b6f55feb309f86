package dns

import (
	"fmt"
	"testing"

	mdns "github.com/miekg/dns"
)

// A full shard asked to store a key it already holds replaces that entry;
// it must not evict another one to make room it does not need.
func TestCachePutReplacesInPlaceWhenFull(t *testing.T) {
	c := NewCache(CacheOptions{Size: 2 * cacheShards}) // two entries per shard
	answer := func(name, addr string) ([]byte, *mdns.Msg) {
		q := new(mdns.Msg)
		q.SetQuestion(name, mdns.TypeA)
		m := new(mdns.Msg)
		m.SetReply(q)
		m.Answer = []mdns.RR{mustRR(name + " 300 IN A " + addr)}
		pkt, _ := q.Pack()
		var r request
		var lower [256]byte
		if err := parseRequest(pkt, lower[:], &r); err != nil {
			t.Fatal(err)
		}
		return cacheKey(nil, &r), m
	}
	// Two names that land in the same shard fill it.
	keyA, msgA := answer("a.test.", "192.0.2.1")
	var keyB []byte
	var msgB *mdns.Msg
	for i := 0; keyB == nil; i++ {
		k, m := answer(fmt.Sprintf("b%d.test.", i), "192.0.2.2")
		if c.shard(k) == c.shard(keyA) {
			keyB, msgB = k, m
		}
	}
	c.put(keyA, msgA)
	c.put(keyB, msgB)
	_, msgA2 := answer("a.test.", "192.0.2.9")
	for range 5 {
		if c.put(keyA, msgA2) == nil {
			t.Fatal("answer not stored")
		}
	}
	if success, denial := c.Evictions(); success != 0 || denial != 0 {
		t.Errorf("storing a key the full shard holds evicted %d positive, %d negative entries", success, denial)
	}
	if n := c.Len(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	if e, _ := c.get(keyB, c.now()); e == nil {
		t.Error("the other entry of the shard is gone")
	}
	e, _ := c.get(keyA, c.now())
	var got mdns.Msg
	if e == nil || got.Unpack(e.msg) != nil || len(got.Answer) != 1 || got.Answer[0].(*mdns.A).A.String() != "192.0.2.9" {
		t.Errorf("the replaced entry: %v", got.Answer)
	}
}
