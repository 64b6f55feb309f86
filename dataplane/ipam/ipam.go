// Package ipam hands out pod addresses from a node's podCIDRs: an
// attachment holds at most one address per family, so a dual-stack pod's
// two addresses are taken (and, after a crash, kept or lost) in one
// transaction of the one store.
//
// The whole store is one small JSON file per network, rewritten on every
// change by write, fsync, rename: after a crash at any point it holds either
// the state before a change or after it, never a torn mix. The directory is
// fsynced too, after the lock is released: that only makes the rename
// durable, which no other process needs to wait for (they read the page
// cache), and under I/O pressure each fsync can cost a journal commit that
// every waiting ADD would otherwise pay again.
// Every reader and writer holds an exclusive flock on a separate lock file for
// the whole read-modify-write, so concurrent plugin processes never hand out
// one address twice; the kernel drops the lock when a process dies, so a
// killed plugin cannot wedge the store.
//
// Allocation is round-robin from the address after the last one handed out,
// so an address freed by a DEL is not reused at once (other pods' ARP caches
// and conntrack entries still point at it for a while). The store records the
// boot ID it was written under; the first transaction after a reboot releases
// everything, since no pod survives a reboot.
package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/atomicfile"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// DefaultBootIDFile is where Linux publishes the current boot's random ID.
const DefaultBootIDFile = "/proc/sys/kernel/random/boot_id"

const (
	stateFile = "allocations.json"
	lockFile  = "lock"
	// stateVersion is bumped on incompatible changes of the file format.
	stateVersion = 1
)

// ErrRangeFull is returned by Allocate when every usable address of the
// range is taken.
var ErrRangeFull = errors.New("no free address")

// ErrLocked is returned by Open when another process held the lock for
// longer than the lock timeout.
var ErrLocked = errors.New("ipam store is locked by another process")

// Attachment identifies one pod interface: the CNI (container ID, ifname) pair.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (a Attachment) String() string { return a.ContainerID + "/" + a.IfName }

// Allocation is one address held by one attachment.
type Allocation struct {
	Addr netip.Addr `json:"addr"`
	Attachment
}

// state is the file format.
type state struct {
	Version int    `json:"version"`
	BootID  string `json:"bootID,omitempty"`
	// Last is the last address handed out per range, where the next
	// round-robin search starts.
	Last        map[netip.Prefix]netip.Addr `json:"last,omitempty"`
	Allocations []Allocation                `json:"allocations"`
}

// Options locate a store.
type Options struct {
	// Dir holds the state and lock files; created if missing.
	Dir string
	// BootIDFile is read to detect a reboot; DefaultBootIDFile if empty.
	BootIDFile string
	// LockTimeout bounds the wait for the lock; 30s if zero.
	LockTimeout time.Duration
}

// Txn is an open, locked view of the store. Changes stay in memory until
// Commit; Close releases the lock. A Txn is not safe for concurrent use.
type Txn struct {
	dir      string
	lock     *os.File
	st       state
	dirty    bool
	syncDir  bool // a commit renamed the store; Close fsyncs the directory
	rebooted []Allocation
}

// Open locks the store in opts.Dir and loads it. After a reboot (the boot ID
// differs from the recorded one) every allocation is released; Rebooted
// reports which. The caller must Close the Txn.
func Open(opts Options) (*Txn, error) {
	// Everything that needs no lock happens before it is taken: with many
	// ADDs at once, every microsecond under the lock is paid by all of them.
	bootFile := opts.BootIDFile
	if bootFile == "" {
		bootFile = DefaultBootIDFile
	}
	boot, err := os.ReadFile(bootFile)
	if err != nil {
		return nil, fmt.Errorf("read boot id: %w", err)
	}
	bootID := strings.TrimSpace(string(boot))
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create ipam dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(opts.Dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open ipam lock: %w", err)
	}
	timeout := opts.LockTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	if err := flock(lock, timeout); err != nil {
		return nil, fmt.Errorf("lock ipam store %s: %w", opts.Dir, err)
	}
	t := &Txn{dir: opts.Dir, lock: lock}
	if err := t.load(); err != nil {
		t.Close()
		return nil, err
	}
	if t.st.BootID != bootID {
		if t.st.BootID != "" {
			t.rebooted = t.st.Allocations
			t.st.Allocations = nil
		}
		t.st.BootID = bootID
		t.dirty = true
	}
	return t, nil
}

// flock takes an exclusive lock on f, waiting at most timeout. On timeout the
// waiting goroutine closes f once its flock returns, so nothing leaks a lock.
func flock(f *os.File, timeout time.Duration) error {
	fd := int(f.Fd())
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err == nil {
		return nil
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return err
	}
	var mu sync.Mutex
	abandoned := false
	res := make(chan error, 1)
	go func() {
		err := unix.Flock(fd, unix.LOCK_EX)
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			f.Close()
			return
		}
		res <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-res:
		if err != nil {
			f.Close()
		}
		return err
	case <-timer.C:
		mu.Lock()
		defer mu.Unlock()
		select {
		case err := <-res:
			if err != nil {
				f.Close()
			}
			return err
		default:
			abandoned = true
			return fmt.Errorf("%w (waited %s)", ErrLocked, timeout)
		}
	}
}

func (t *Txn) load() error {
	// Temp files left by a writer killed before its rename are garbage;
	// holding the lock, nobody else can be writing one now.
	if stale, _ := filepath.Glob(filepath.Join(t.dir, "."+stateFile+".tmp-*")); len(stale) > 0 {
		for _, p := range stale {
			os.Remove(p)
		}
	}
	data, err := os.ReadFile(filepath.Join(t.dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		t.st = state{Version: stateVersion}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read ipam store: %w", err)
	}
	if err := json.Unmarshal(data, &t.st); err != nil {
		return fmt.Errorf("decode ipam store %s: %w", filepath.Join(t.dir, stateFile), err)
	}
	if t.st.Version != stateVersion {
		return fmt.Errorf("ipam store %s: version %d, want %d", filepath.Join(t.dir, stateFile), t.st.Version, stateVersion)
	}
	return nil
}

// Rebooted returns the allocations Open released because the machine
// rebooted since they were made.
func (t *Txn) Rebooted() []Allocation { return t.rebooted }

// Allocations returns a copy of every allocation, in address order.
func (t *Txn) Allocations() []Allocation {
	out := slices.Clone(t.st.Allocations)
	slices.SortFunc(out, func(a, b Allocation) int { return a.Addr.Compare(b.Addr) })
	return out
}

// Lookup returns the address of family f held by a.
func (t *Txn) Lookup(a Attachment, f ipfamily.Family) (netip.Addr, bool) {
	for _, al := range t.st.Allocations {
		if al.Attachment == a && f.Has(al.Addr) {
			return al.Addr, true
		}
	}
	return netip.Addr{}, false
}

// Addrs returns every address held by a, in address order (IPv4 first).
func (t *Txn) Addrs(a Attachment) []netip.Addr {
	var out []netip.Addr
	for _, al := range t.st.Allocations {
		if al.Attachment == a {
			out = append(out, al.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// CountIn returns how many allocations lie inside p.
func (t *Txn) CountIn(p netip.Prefix) int {
	n := 0
	for _, al := range t.st.Allocations {
		if p.Contains(al.Addr) {
			n++
		}
	}
	return n
}

// Gateway is the address of rng reserved for the pods' gateway: its first
// host address.
func Gateway(rng netip.Prefix) netip.Addr { return rng.Masked().Addr().Next() }

// Usable reports the first and last address of rng that may go to a pod:
// never the network address, the gateway or (IPv4) the broadcast address.
// ok is false when rng has no such address.
func Usable(rng netip.Prefix) (first, last netip.Addr, ok bool) {
	rng = rng.Masked()
	first = Gateway(rng).Next()
	last = lastAddr(rng)
	if rng.Addr().Is4() {
		last = last.Prev()
	}
	if !first.IsValid() || !last.IsValid() || last.Less(first) {
		return netip.Addr{}, netip.Addr{}, false
	}
	return first, last, true
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Allocate returns the address of a in rng, taking the next free one
// (round-robin) if a holds none. An address of rng's family that a holds
// outside rng (a podCIDR that changed) is released first; its address of
// the other family stays.
func (t *Txn) Allocate(rng netip.Prefix, a Attachment) (addr netip.Addr, fresh bool, err error) {
	rng = rng.Masked()
	if cur, ok := t.Lookup(a, ipfamily.OfPrefix(rng)); ok {
		if rng.Contains(cur) {
			return cur, false, nil
		}
		t.releaseAddr(cur)
	}
	first, last, ok := Usable(rng)
	if !ok {
		return netip.Addr{}, false, fmt.Errorf("range %s: %w (it has no usable address)", rng, ErrRangeFull)
	}
	taken := make(map[netip.Addr]bool, len(t.st.Allocations))
	for _, al := range t.st.Allocations {
		taken[al.Addr] = true
	}
	start := first
	if prev, ok := t.st.Last[rng]; ok && rng.Contains(prev) && !prev.Less(first) && prev.Less(last) {
		start = prev.Next()
	}
	cand := start
	for {
		if !taken[cand] {
			t.st.Allocations = append(t.st.Allocations, Allocation{Addr: cand, Attachment: a})
			if t.st.Last == nil {
				t.st.Last = map[netip.Prefix]netip.Addr{}
			}
			t.st.Last[rng] = cand
			t.dirty = true
			return cand, true, nil
		}
		if cand == last {
			cand = first
		} else {
			cand = cand.Next()
		}
		if cand == start {
			return netip.Addr{}, false, fmt.Errorf("range %s: %w: all %d usable addresses (%s-%s) are allocated",
				rng, ErrRangeFull, countBetween(first, last), first, last)
		}
	}
}

// countBetween returns how many addresses lie in [first, last]; ranges
// wider than 64 bits saturate, which only matters for a message.
func countBetween(first, last netip.Addr) uint64 {
	f, l := first.As16(), last.As16()
	for i := 0; i < 8; i++ {
		if f[i] != l[i] {
			return ^uint64(0)
		}
	}
	var fv, lv uint64
	for i := 8; i < 16; i++ {
		fv = fv<<8 | uint64(f[i])
		lv = lv<<8 | uint64(l[i])
	}
	return lv - fv + 1
}

// Release frees every address held by a (one per family) and returns them.
func (t *Txn) Release(a Attachment) []netip.Addr {
	var out []netip.Addr
	t.Retain(func(al Allocation) bool {
		if al.Attachment == a {
			out = append(out, al.Addr)
			return false
		}
		return true
	})
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// releaseAddr frees addr.
func (t *Txn) releaseAddr(addr netip.Addr) {
	t.Retain(func(al Allocation) bool { return al.Addr != addr })
}

// Retain keeps only the allocations keep returns true for and returns the
// ones it dropped.
func (t *Txn) Retain(keep func(Allocation) bool) []Allocation {
	var dropped []Allocation
	kept := t.st.Allocations[:0]
	for _, al := range t.st.Allocations {
		if keep(al) {
			kept = append(kept, al)
		} else {
			dropped = append(dropped, al)
		}
	}
	t.st.Allocations = kept
	if len(dropped) > 0 {
		t.dirty = true
	}
	return dropped
}

// Commit makes the changes durable. Without changes it writes nothing.
func (t *Txn) Commit() error {
	if !t.dirty {
		return nil
	}
	if t.st.Allocations == nil {
		t.st.Allocations = []Allocation{}
	}
	data, err := json.Marshal(&t.st)
	if err != nil {
		return fmt.Errorf("encode ipam store: %w", err)
	}
	if err := atomicfile.Replace(filepath.Join(t.dir, stateFile), data, 0o600); err != nil {
		return fmt.Errorf("write ipam store: %w", err)
	}
	t.dirty = false
	t.syncDir = true
	return nil
}

// Close releases the lock, dropping uncommitted changes, then makes a
// committed change durable. It is safe to call more than once; callers that
// committed check its error.
func (t *Txn) Close() error {
	if t.lock == nil {
		return nil
	}
	err := t.lock.Close() // closing the last fd drops the flock
	t.lock = nil
	if t.syncDir {
		t.syncDir = false
		if serr := atomicfile.SyncDir(t.dir); serr != nil && err == nil {
			err = fmt.Errorf("fsync ipam dir: %w", serr)
		}
	}
	return err
}
