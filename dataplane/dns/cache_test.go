package dns

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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

// TestCacheHitsFollowTheCoarseClock: while runClock runs, a hit is fresh or
// expired by the time it last read, and when it stops hits read the clock
// again.
func TestCacheHitsFollowTheCoarseClock(t *testing.T) {
	c := NewCache(CacheOptions{MinTTL: 5 * time.Second})
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q := new(mdns.Msg)
	q.SetQuestion("a.test.", mdns.TypeA)
	m := new(mdns.Msg)
	m.SetReply(q)
	m.Answer = []mdns.RR{mustRR("a.test. 5 IN A 192.0.2.1")}
	c.put([]byte("k"), m)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { c.runClock(ctx); close(stopped) }()
	waitCoarse := func(want time.Time) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for c.coarse.Load() != want.UnixNano() {
			if time.Now().After(deadline) {
				t.Fatalf("runClock did not read %v within 10s", want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCoarse(now)
	if _, fresh := c.get([]byte("k"), c.clock()); !fresh {
		t.Error("entry stale at once")
	}
	mu.Lock()
	now = now.Add(5 * time.Second)
	mu.Unlock()
	waitCoarse(c.now())
	if _, fresh := c.get([]byte("k"), c.clock()); fresh {
		t.Error("entry fresh once the coarse clock passed its TTL")
	}
	cancel()
	<-stopped
	mu.Lock()
	now = now.Add(-time.Second)
	mu.Unlock()
	if _, fresh := c.get([]byte("k"), c.clock()); !fresh || c.coarse.Load() != 0 {
		t.Error("after runClock stopped, hits do not read the clock")
	}
}
