package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func testOptions(t *testing.T) Options {
	t.Helper()
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(boot, []byte("boot-a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Options{Dir: filepath.Join(dir, "store"), BootIDFile: boot}
}

// allocate runs one transaction that allocates for a and commits.
func allocate(t *testing.T, o Options, rng string, a Attachment) (netip.Addr, error) {
	t.Helper()
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	addr, _, err := txn.Allocate(netip.MustParsePrefix(rng), a)
	if err != nil {
		return addr, err
	}
	return addr, txn.Commit()
}

func release(t *testing.T, o Options, a Attachment) {
	t.Helper()
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if len(txn.Release(a)) == 0 {
		t.Fatalf("release %s: not allocated", a)
	}
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}
}

func att(i int) Attachment { return Attachment{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"} }

func TestNeverNetworkGatewayOrBroadcast(t *testing.T) {
	o := testOptions(t)
	got := map[netip.Addr]bool{}
	for i := range 5 {
		a, err := allocate(t, o, "10.1.0.8/29", att(i))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got[a] = true
	}
	want := map[netip.Addr]bool{}
	for _, s := range []string{"10.1.0.10", "10.1.0.11", "10.1.0.12", "10.1.0.13", "10.1.0.14"} {
		want[netip.MustParseAddr(s)] = true
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("allocated %v, want %v", got, want)
	}
	_, err := allocate(t, o, "10.1.0.8/29", att(99))
	if !errors.Is(err, ErrRangeFull) || !strings.Contains(err.Error(), "10.1.0.8/29") || !strings.Contains(err.Error(), "all 5 usable addresses") {
		t.Errorf("full range: %v, want ErrRangeFull naming 10.1.0.8/29 and its 5 addresses", err)
	}
}

func TestSameAttachmentKeepsItsAddress(t *testing.T) {
	o := testOptions(t)
	a1, _ := allocate(t, o, "10.1.0.0/24", att(1))
	a2, _ := allocate(t, o, "10.1.0.0/24", att(1))
	if a1 != a2 {
		t.Errorf("second allocation for one attachment gave %s, first %s", a2, a1)
	}
	// A changed range moves the attachment into it.
	a3, _ := allocate(t, o, "10.2.0.0/24", att(1))
	txn, _ := Open(o)
	defer txn.Close()
	if al := txn.Allocations(); len(al) != 1 || al[0].Addr != a3 || !netip.MustParsePrefix("10.2.0.0/24").Contains(a3) {
		t.Errorf("after a range change: %v, want only %s in 10.2.0.0/24", al, a3)
	}
}

func TestRoundRobinDoesNotReuseAtOnce(t *testing.T) {
	o := testOptions(t)
	first, _ := allocate(t, o, "10.1.0.0/24", att(1))
	release(t, o, att(1))
	next, _ := allocate(t, o, "10.1.0.0/24", att(2))
	if next == first {
		t.Errorf("freed %s was handed out again at once", first)
	}
	if next != first.Next() {
		t.Errorf("next allocation %s, want %s (round-robin)", next, first.Next())
	}
	// Wraps around past the end of the range, skipping taken addresses.
	o2 := testOptions(t)
	for i := range 5 {
		allocate(t, o2, "10.1.0.8/29", att(i))
	}
	release(t, o2, att(0)) // 10.1.0.10
	release(t, o2, att(2)) // 10.1.0.12
	a, _ := allocate(t, o2, "10.1.0.8/29", att(10))
	if a != netip.MustParseAddr("10.1.0.10") {
		t.Errorf("after the last address, got %s, want the wrap-around to 10.1.0.10", a)
	}
	a, _ = allocate(t, o2, "10.1.0.8/29", att(11))
	if a != netip.MustParseAddr("10.1.0.12") {
		t.Errorf("got %s, want 10.1.0.12 (10.1.0.11 is taken)", a)
	}
}

func TestUncommittedChangesAreDropped(t *testing.T) {
	o := testOptions(t)
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := txn.Allocate(netip.MustParsePrefix("10.1.0.0/24"), att(1)); err != nil {
		t.Fatal(err)
	}
	txn.Close()
	txn, _ = Open(o)
	defer txn.Close()
	if al := txn.Allocations(); len(al) != 0 {
		t.Errorf("allocations %v survived a transaction that was never committed", al)
	}
}

func TestRebootReleasesEverything(t *testing.T) {
	o := testOptions(t)
	allocate(t, o, "10.1.0.0/24", att(1))
	allocate(t, o, "10.1.0.0/24", att(2))
	if err := os.WriteFile(o.BootIDFile, []byte("boot-b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(txn.Rebooted()) != 2 || len(txn.Allocations()) != 0 {
		t.Errorf("after reboot: released %v, kept %v; want 2 released, none kept", txn.Rebooted(), txn.Allocations())
	}
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}
	txn.Close()
	txn, _ = Open(o)
	defer txn.Close()
	if len(txn.Rebooted()) != 0 {
		t.Errorf("second open after the reboot released %v again", txn.Rebooted())
	}
}

func TestBrokenStoreIsAnErrorAndTempFilesAreIgnored(t *testing.T) {
	o := testOptions(t)
	allocate(t, o, "10.1.0.0/24", att(1))
	// A writer killed before its rename leaves a temp file; it is ignored
	// and cleaned up.
	tmp := filepath.Join(o.Dir, "."+stateFile+".tmp-123")
	if err := os.WriteFile(tmp, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(txn.Allocations()) != 1 {
		t.Errorf("allocations %v, want the one committed", txn.Allocations())
	}
	txn.Close()
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("stale temp file still there: %v", err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, stateFile), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), stateFile) {
		t.Errorf("open of a corrupt store: %v, want an error naming the file", err)
	}
}

func TestConcurrentTransactionsNeverShareAnAddress(t *testing.T) {
	o := testOptions(t)
	const n = 40
	addrs := make([]netip.Addr, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			txn, err := Open(o)
			if err != nil {
				errs[i] = err
				return
			}
			defer txn.Close()
			addrs[i], _, errs[i] = txn.Allocate(netip.MustParsePrefix("10.1.0.0/24"), att(i))
			if errs[i] == nil {
				errs[i] = txn.Commit()
			}
		})
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[addrs[i]] {
			t.Errorf("%s handed out twice", addrs[i])
		}
		seen[addrs[i]] = true
	}
}

func TestLockTimeout(t *testing.T) {
	o := testOptions(t)
	holder, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	o.LockTimeout = 50 * time.Millisecond
	if _, err := Open(o); !errors.Is(err, ErrLocked) {
		t.Errorf("open while locked: %v, want ErrLocked", err)
	}
	holder.Close()
	txn, err := Open(o)
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	txn.Close()
}

func TestUsable(t *testing.T) {
	for _, tc := range []struct {
		rng, first, last string
		ok               bool
	}{
		{"10.244.1.0/24", "10.244.1.2", "10.244.1.254", true},
		{"10.0.0.0/30", "10.0.0.2", "10.0.0.2", true},
		{"10.0.0.0/31", "", "", false},
		{"fd00::/120", "fd00::2", "fd00::ff", true},
	} {
		f, l, ok := Usable(netip.MustParsePrefix(tc.rng))
		if ok != tc.ok || (ok && (f.String() != tc.first || l.String() != tc.last)) {
			t.Errorf("Usable(%s) = %s, %s, %v; want %s, %s, %v", tc.rng, f, l, ok, tc.first, tc.last, tc.ok)
		}
	}
}

// TestOneAddressPerFamily: a dual-stack attachment holds one address of
// each family, taken in one transaction; a second ADD finds both, a new
// podCIDR of one family replaces only that family's address, DEL frees
// both, and a reboot releases both.
func TestOneAddressPerFamily(t *testing.T) {
	o := testOptions(t)
	v4, v6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")
	both := func(a Attachment, r4, r6 netip.Prefix) (netip.Addr, netip.Addr) {
		t.Helper()
		txn, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Close()
		a4, _, err4 := txn.Allocate(r4, a)
		a6, _, err6 := txn.Allocate(r6, a)
		if err := errors.Join(err4, err6, txn.Commit()); err != nil {
			t.Fatal(err)
		}
		return a4, a6
	}
	a4, a6 := both(att(1), v4, v6)
	if a4 != netip.MustParseAddr("10.244.1.2") || a6 != netip.MustParseAddr("fd00:10:244:1::2") {
		t.Fatalf("first pod got %s and %s, want 10.244.1.2 and fd00:10:244:1::2", a4, a6)
	}
	if b4, b6 := both(att(1), v4, v6); b4 != a4 || b6 != a6 {
		t.Errorf("a repeated ADD got %s and %s, want %s and %s again", b4, b6, a4, a6)
	}
	if b4, b6 := both(att(2), v4, v6); b4 != netip.MustParseAddr("10.244.1.3") || b6 != netip.MustParseAddr("fd00:10:244:1::3") {
		t.Errorf("second pod got %s and %s", b4, b6)
	}
	moved := netip.MustParsePrefix("fd00:10:244:9::/64")
	if b4, b6 := both(att(1), v4, moved); b4 != a4 || !moved.Contains(b6) {
		t.Errorf("after the IPv6 podCIDR moved: %s and %s, want %s kept and an address of %s", b4, b6, a4, moved)
	}
	txn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if got := txn.Addrs(att(1)); len(got) != 2 {
		t.Errorf("attachment holds %v, want one address per family", got)
	}
	if got := txn.Release(att(2)); len(got) != 2 || got[0] != netip.MustParseAddr("10.244.1.3") {
		t.Errorf("release gave back %v, want both of att 2's addresses, IPv4 first", got)
	}
	txn.Commit()
	txn.Close()

	os.WriteFile(o.BootIDFile, []byte("boot-b\n"), 0o644)
	txn, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if r := txn.Rebooted(); len(r) != 2 || len(txn.Allocations()) != 0 {
		t.Errorf("after a reboot: released %v, still held %v; want both families released", r, txn.Allocations())
	}
}
