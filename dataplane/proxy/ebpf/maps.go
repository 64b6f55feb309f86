package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/bpf"
)

// Table is one BPF hash map as the syncer uses it: batched writes and
// deletes, and a dump of everything in it.
type Table[K comparable, V any] interface {
	// Put writes vals[i] at keys[i], in order.
	Put(keys []K, vals []V) error
	// Delete removes keys; like the kernel, a missing key is an error.
	Delete(keys []K) error
	// Dump returns every entry.
	Dump() (map[K]V, error)
	// Each calls fn with every entry, reading them in batches.
	Each(fn func(K, V)) error
}

// Maps are the tables the proxy programs.
type Maps struct {
	Services  Table[svcKey, svcVal]
	Backends  Table[uint32, backend]
	NodeAddrs Table[nodeKey, uint8]
	Ranges    Table[rangeKey, uint8]
	Maglev    Table[uint32, maglevTable]
	// SNAT holds, at snatIPv4 and snatIPv6, the address of each family
	// traffic from outside to externalIPs and load-balancer IPs is SNATed
	// to.
	SNAT Table[uint32, bpf.NodeportSnatAddr]
}

// kernelTable is a Table over a real map, using the batch operations
// (one syscall per few thousand entries instead of one per entry).
type kernelTable[K comparable, V any] struct {
	m *ebpf.Map
}

const batchSize = 4096

func (t kernelTable[K, V]) Put(keys []K, vals []V) error {
	for i := 0; i < len(keys); i += batchSize {
		j := min(i+batchSize, len(keys))
		if _, err := t.m.BatchUpdate(keys[i:j], vals[i:j], nil); err != nil {
			return fmt.Errorf("update map %s: %w", t.name(), err)
		}
	}
	return nil
}

func (t kernelTable[K, V]) Delete(keys []K) error {
	for i := 0; i < len(keys); i += batchSize {
		j := min(i+batchSize, len(keys))
		if _, err := t.m.BatchDelete(keys[i:j], nil); err != nil {
			return fmt.Errorf("delete from map %s: %w", t.name(), err)
		}
	}
	return nil
}

func (t kernelTable[K, V]) Dump() (map[K]V, error) {
	out := make(map[K]V)
	if err := t.Each(func(k K, v V) { out[k] = v }); err != nil {
		return nil, err
	}
	return out, nil
}

func (t kernelTable[K, V]) Each(fn func(K, V)) error {
	var cursor ebpf.MapBatchCursor
	// Up to batchSize entries a read, and 1 MiB (256 Maglev tables); the
	// buffers start at 64 KiB and grow while reads fill them, so a map
	// that holds little (the Maglev tables of a cluster without external
	// Services) does not cost a full sync 1 MiB of garbage.
	var v V
	most := max(1, min(batchSize, (1<<20)/int(max(unsafe.Sizeof(v), 1))))
	n := max(1, min(most, (64<<10)/int(max(unsafe.Sizeof(v), 1))))
	keys := make([]K, n)
	vals := make([]V, n)
	for {
		got, err := t.m.BatchLookup(&cursor, keys, vals, nil)
		for i := range got {
			fn(keys[i], vals[i])
		}
		if got == len(keys) && len(keys) < most {
			n = min(most, 4*len(keys))
			keys, vals = make([]K, n), make([]V, n)
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read map %s: %w", t.name(), err)
		}
	}
}

func (t kernelTable[K, V]) name() string {
	if info, err := t.m.Info(); err == nil {
		return info.Name
	}
	return t.m.String()
}

// FakeTable is an in-memory Table that refuses what the kernel refuses: a
// write beyond max entries (E2BIG) and deleting a missing key (ENOENT).
// Writes and deletes are logged in order, so tests can check the order.
type FakeTable[K comparable, V any] struct {
	Max     int
	Entries map[K]V
	// Log records "put"/"del" per key, in the order applied.
	Log []FakeOp[K]
	// OnChange, if set, runs after every single write or delete, as a
	// reader between two of them would see the maps.
	OnChange func(op string)
}

// FakeOp is one logged operation.
type FakeOp[K comparable] struct {
	Op  string
	Key K
}

// NewFakeTable returns an empty FakeTable holding at most max entries.
func NewFakeTable[K comparable, V any](max int) *FakeTable[K, V] {
	return &FakeTable[K, V]{Max: max, Entries: make(map[K]V)}
}

func (t *FakeTable[K, V]) Put(keys []K, vals []V) error {
	for i, k := range keys {
		v := vals[i]
		if _, ok := t.Entries[k]; !ok && len(t.Entries) >= t.Max {
			return fmt.Errorf("update fake map: %w", syscall.E2BIG)
		}
		t.Entries[k] = v
		t.Log = append(t.Log, FakeOp[K]{"put", k})
		if t.OnChange != nil {
			t.OnChange("put")
		}
	}
	return nil
}

func (t *FakeTable[K, V]) Delete(keys []K) error {
	for _, k := range keys {
		if _, ok := t.Entries[k]; !ok {
			return fmt.Errorf("delete from fake map: %v: %w", k, syscall.ENOENT)
		}
		delete(t.Entries, k)
		t.Log = append(t.Log, FakeOp[K]{"del", k})
		if t.OnChange != nil {
			t.OnChange("del")
		}
	}
	return nil
}

func (t *FakeTable[K, V]) Each(fn func(K, V)) error {
	for k, v := range t.Entries {
		fn(k, v)
	}
	return nil
}

func (t *FakeTable[K, V]) Dump() (map[K]V, error) {
	out := make(map[K]V, len(t.Entries))
	for k, v := range t.Entries {
		out[k] = v
	}
	return out, nil
}

// NewFakeMaps returns Maps over FakeTables sized like the real maps.
func NewFakeMaps() (*Maps, *FakeTable[svcKey, svcVal], *FakeTable[uint32, backend]) {
	s := NewFakeTable[svcKey, svcVal](1 << 18)
	b := NewFakeTable[uint32, backend](1 << 18)
	return &Maps{Services: s, Backends: b, NodeAddrs: NewFakeTable[nodeKey, uint8](256),
		Ranges: NewFakeTable[rangeKey, uint8](1 << 14), Maglev: NewFakeTable[uint32, maglevTable](1 << 14), SNAT: NewFakeTable[uint32, bpf.NodeportSnatAddr](2)}, s, b
}

// nodeAddrEntries is the node-address map's content for addrs.
func nodeAddrEntries(addrs []netip.Addr) map[nodeKey]uint8 {
	out := make(map[nodeKey]uint8, len(addrs))
	for _, a := range addrs {
		out[nodeKey{Addr: addr16(a)}] = 1
	}
	return out
}
