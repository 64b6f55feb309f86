package dns

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
)

// CacheOptions bounds the cache of forwarded answers.
type CacheOptions struct {
	// Size is the most entries kept (positive and negative together).
	Size int
	// MinTTL and MaxTTL clamp the TTLs of positive answers; MaxNegTTL caps
	// negative ones (NXDOMAIN and NODATA, from the SOA). The defaults are
	// kubeadm's Corefile's `cache 30`: 5 s to 30 s for both.
	MinTTL, MaxTTL, MaxNegTTL time.Duration
	// PrefetchHits: an entry hit this often is refreshed in the background
	// once less than a tenth of its TTL is left. 0 disables prefetch.
	PrefetchHits int
	// StaleFor is how long past expiry an answer may still be served when
	// no upstream answers (RFC 8767); 0 disables serve-stale.
	StaleFor time.Duration
}

func (o *CacheOptions) setDefaults() {
	if o.Size <= 0 {
		o.Size = 10000
	}
	if o.MinTTL <= 0 {
		o.MinTTL = 5 * time.Second
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = DefaultCacheMaxTTL
	}
	if o.MaxNegTTL <= 0 {
		o.MaxNegTTL = DefaultCacheMaxTTL
	}
}

// DefaultCacheMaxTTL is the longest a forwarded answer is cached unless
// configured: kubeadm's Corefile says `cache 30`.
const DefaultCacheMaxTTL = 30 * time.Second

const cacheShards = 32

// staleTTL is the TTL of an answer served stale (RFC 8767 4).
const staleTTL = 30

// Cache holds forwarded answers in wire form, ready to copy out: only the
// ID, the question's case and the TTLs are patched per hit. Safe for
// concurrent use.
type Cache struct {
	opts   CacheOptions
	seed   maphash.Seed
	shards [cacheShards]cacheShard
	now    func() time.Time
	// coarse is now (Unix nanoseconds) as runClock last read it, 0 while
	// it does not run: a hit reads it instead of the clock.
	coarse atomic.Int64
	// evicted counts entries dropped to make room, positive [0] and
	// negative [1] (coredns_cache_evictions_total).
	evicted [2]atomic.Uint64
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string]*cacheEntry
}

type cacheEntry struct {
	msg      []byte   // packed answer, ID 0, no OPT
	ttlOffs  []uint16 // where each record's TTL sits in msg
	ttls     []uint32 // clamped TTLs, in the same order
	stored   time.Time
	ttl      time.Duration // lifetime: the smallest TTL
	hits     atomic.Int32
	fetching atomic.Bool // a prefetch is under way
	denial   bool        // NXDOMAIN or NODATA
}

// NewCache returns an empty cache.
func NewCache(opts CacheOptions) *Cache {
	opts.setDefaults()
	c := &Cache{opts: opts, seed: maphash.MakeSeed(), now: time.Now}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*cacheEntry)
	}
	return c
}

// Len returns the number of entries.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.RLock()
		n += len(c.shards[i].m)
		c.shards[i].mu.RUnlock()
	}
	return n
}

// Counts returns the number of positive and of negative (NXDOMAIN, NODATA)
// entries.
func (c *Cache) Counts() (success, denial int) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		for _, e := range sh.m {
			if e.denial {
				denial++
			} else {
				success++
			}
		}
		sh.mu.RUnlock()
	}
	return success, denial
}

// Evictions returns how many positive and negative entries were dropped to
// make room for new ones.
func (c *Cache) Evictions() (success, denial uint64) {
	return c.evicted[0].Load(), c.evicted[1].Load()
}

// cacheKey is the lowercased wire name, the type and the DO and CD bits.
func cacheKey(buf []byte, r *request) []byte {
	buf = append(buf[:0], r.lower...)
	buf = binary.BigEndian.AppendUint16(buf, r.qtype)
	buf = binary.BigEndian.AppendUint16(buf, r.qclass)
	var f byte
	if r.do {
		f |= 1
	}
	if r.flags&flagCD != 0 {
		f |= 2
	}
	return append(buf, f)
}

func (c *Cache) shard(key []byte) *cacheShard {
	return &c.shards[maphash.Bytes(c.seed, key)%cacheShards]
}

// coarseTick is how often runClock reads the clock. A hit that read the
// clock itself spent 73 ns of its 157 there (BenchmarkServe/cached, on
// kvm-clock), more than the rest of the cache's work; answers' TTLs are
// whole seconds, and an entry served 20 ms past its expiry is served as
// fresh as the upstream's TTL allowed.
const coarseTick = 20 * time.Millisecond

// runClock keeps the time hits read until ctx ends.
func (c *Cache) runClock(ctx context.Context) {
	t := time.NewTicker(coarseTick)
	defer t.Stop()
	defer c.coarse.Store(0)
	for {
		c.coarse.Store(c.now().UnixNano())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// clock is the time of a hit: runClock's, or the clock's when it does not
// run.
func (c *Cache) clock() time.Time {
	if n := c.coarse.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return c.now()
}

// get returns the entry for key and whether it is still fresh at now.
func (c *Cache) get(key []byte, now time.Time) (*cacheEntry, bool) {
	sh := c.shard(key)
	sh.mu.RLock()
	e := sh.m[string(key)]
	sh.mu.RUnlock()
	if e == nil {
		return nil, false
	}
	return e, now.Sub(e.stored) < e.ttl
}

// usableStale reports whether e may still be served stale.
func (c *Cache) usableStale(e *cacheEntry) bool {
	return c.opts.StaleFor > 0 && c.now().Sub(e.stored) < e.ttl+c.opts.StaleFor
}

// wantsPrefetch counts a hit and reports whether the caller should refresh
// the entry now (it then owns the refresh until put replaces the entry).
func (c *Cache) wantsPrefetch(e *cacheEntry, now time.Time) bool {
	if c.opts.PrefetchHits <= 0 {
		return false
	}
	h := e.hits.Add(1)
	if int(h) < c.opts.PrefetchHits || e.ttl < 2*time.Second {
		return false
	}
	left := e.ttl - now.Sub(e.stored)
	if left > e.ttl/10 {
		return false
	}
	return e.fetching.CompareAndSwap(false, true)
}

// put stores m, the upstream's answer to the question under key, if it is
// cacheable, and returns the new entry (nil if not stored).
func (c *Cache) put(key []byte, m *mdns.Msg) *cacheEntry {
	if m.Truncated || (m.Rcode != mdns.RcodeSuccess && m.Rcode != mdns.RcodeNameError) {
		return nil
	}
	ttl, ok := c.lifetime(m)
	if !ok {
		return nil
	}
	cp := m.Copy()
	cp.Id = 0
	cp.Extra = dropOPT(cp.Extra)
	cp.Compress = true
	wire, err := cp.Pack()
	if err != nil {
		return nil
	}
	offs, err := ttlOffsets(wire)
	if err != nil {
		return nil
	}
	e := &cacheEntry{msg: wire, ttlOffs: offs, ttls: make([]uint32, len(offs)), stored: c.now(), ttl: ttl}
	lo, hi := uint32(c.opts.MinTTL/time.Second), uint32(c.opts.MaxTTL/time.Second)
	if len(m.Answer) == 0 || m.Rcode != mdns.RcodeSuccess {
		hi = uint32(c.opts.MaxNegTTL / time.Second)
		e.denial = true
	}
	for i, o := range offs {
		t := binary.BigEndian.Uint32(wire[o:])
		e.ttls[i] = min(max(t, lo), hi)
	}
	sh := c.shard(key)
	sh.mu.Lock()
	// A key the shard holds is replaced in place: only a new one needs room.
	if _, held := sh.m[string(key)]; !held && len(sh.m) >= (c.opts.Size+cacheShards-1)/cacheShards {
		c.evictLocked(sh)
	}
	sh.m[string(key)] = e
	sh.mu.Unlock()
	return e
}

// evictLocked drops one entry: an expired one past its stale window if it
// finds one among the first few, else an arbitrary one.
func (c *Cache) evictLocked(sh *cacheShard) {
	now := c.now()
	var victim string
	var denial bool
	n := 0
	for k, e := range sh.m {
		if victim == "" {
			victim, denial = k, e.denial
		}
		if now.Sub(e.stored) > e.ttl+c.opts.StaleFor {
			victim, denial = k, e.denial
			break
		}
		if n++; n >= 8 {
			break
		}
	}
	delete(sh.m, victim)
	if denial {
		c.evicted[1].Add(1)
	} else {
		c.evicted[0].Add(1)
	}
}

// lifetime is how long m may be cached: the smallest answer TTL for a
// positive answer, the SOA's for a negative one, clamped.
func (c *Cache) lifetime(m *mdns.Msg) (time.Duration, bool) {
	if m.Rcode == mdns.RcodeSuccess && len(m.Answer) > 0 {
		t := uint32(1<<31 - 1)
		for _, rr := range m.Answer {
			t = min(t, rr.Header().Ttl)
		}
		d := time.Duration(t) * time.Second
		return min(max(d, c.opts.MinTTL), c.opts.MaxTTL), true
	}
	for _, rr := range m.Ns {
		if soa, ok := rr.(*mdns.SOA); ok {
			d := time.Duration(min(soa.Hdr.Ttl, soa.Minttl)) * time.Second
			return min(max(d, c.opts.MinTTL), c.opts.MaxNegTTL), true
		}
	}
	return c.opts.MinTTL, true
}

func dropOPT(rrs []mdns.RR) []mdns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != mdns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

// reply writes the entry as the answer to r: the client's ID, RD and CD
// bits and question (its case), TTLs aged; stale answers get staleTTL.
func (c *Cache) reply(buf []byte, e *cacheEntry, r *request, stale bool, now time.Time) []byte {
	buf = append(buf[:0], e.msg...)
	binary.BigEndian.PutUint16(buf, r.id)
	f := binary.BigEndian.Uint16(buf[2:])
	f = f&^(flagRD|flagCD) | r.flags&(flagRD|flagCD)
	binary.BigEndian.PutUint16(buf[2:], f)
	copy(buf[headerLen:], r.qname)
	age := uint32(now.Sub(e.stored) / time.Second)
	for i, o := range e.ttlOffs {
		t := staleTTL
		if !stale {
			t = int(e.ttls[i]) - int(age)
			if t < 0 {
				t = 0
			}
		}
		binary.BigEndian.PutUint32(buf[o:], uint32(t))
	}
	return withOPT(buf, r)
}

// ttlOffsets finds the TTL field of every record of a packed message.
func ttlOffsets(msg []byte) ([]uint16, error) {
	if len(msg) < headerLen {
		return nil, errMalformed
	}
	qd := int(binary.BigEndian.Uint16(msg[4:]))
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) + int(binary.BigEndian.Uint16(msg[10:]))
	off := headerLen
	var err error
	for range qd {
		if off, err = skipName(msg, off); err != nil {
			return nil, err
		}
		off += 4
	}
	offs := make([]uint16, 0, rrs)
	for range rrs {
		if off, err = skipName(msg, off); err != nil {
			return nil, err
		}
		if off+10 > len(msg) {
			return nil, errMalformed
		}
		offs = append(offs, uint16(off+4))
		off += 10 + int(binary.BigEndian.Uint16(msg[off+8:]))
	}
	if off > len(msg) {
		return nil, errMalformed
	}
	return offs, nil
}

func skipName(msg []byte, off int) (int, error) {
	for {
		if off >= len(msg) {
			return 0, errMalformed
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xC0 == 0xC0:
			return off + 2, nil
		case l > 63:
			return 0, errMalformed
		}
		off += 1 + l
	}
}

// Flush drops every entry.
func (c *Cache) Flush() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}
