package statedir

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// TestRescanRepairsWhatNoEventBrought: changes the watcher never named (a
// file added, rewritten in place to the same size with its modification
// time set back, replaced by rename, removed) and a Store that lost an
// object are all found by a full scan, applied, and counted as repairs.
func TestRescanRepairsWhatNoEventBrought(t *testing.T) {
	dir := t.TempDir()
	src, store, w := scanner(t, dir)
	src.inFlight = 0
	a, b, c := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yaml")
	write(t, a, nsYAML("a1"))
	write(t, b, nsYAML("b1"))
	write(t, c, nsYAML("c1"))
	src.rescan(w, nil)
	if got := src.Status(); got.Repairs != 0 || got.Files != 3 || got.Read != 3 || !got.InStep {
		t.Fatalf("after the first load: %+v, want 3 files read, in step, no repairs", got)
	}
	check := func(what string, repairs uint64, want ...string) {
		t.Helper()
		src.rescan(w, nil)
		if got := storeKeys(store); !slices.Equal(got, want) {
			t.Errorf("%s: store %v, want %v", what, got, want)
		}
		if got := src.Status(); got.Repairs != repairs || !got.InStep {
			t.Errorf("%s: %+v, want %d repairs so far, in step", what, got, repairs)
		}
	}
	check("nothing changed", 0, "Namespace a1", "Namespace b1", "Namespace c1")

	// Same size, modification time set back: only the change time (or
	// the racy read) tells.
	st, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	write(t, a, nsYAML("a2"))
	if err := os.Chtimes(a, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	check("rewritten in place, same size and mtime", 1, "Namespace a2", "Namespace b1", "Namespace c1")

	write(t, filepath.Join(dir, ".b.tmp"), nsYAML("b2"))
	if err := os.Rename(filepath.Join(dir, ".b.tmp"), b); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "d.yaml"), nsYAML("d"))
	if err := os.Remove(c); err != nil {
		t.Fatal(err)
	}
	check("replaced, added, removed", 4, "Namespace a2", "Namespace b2", "Namespace d")

	store.Delete(cluster.KindNamespace, cluster.Key{Name: "d"})
	store.Upsert(&cluster.Namespace{Name: "stray"})
	check("store out of step", 6, "Namespace a2", "Namespace b2", "Namespace d")

	// A named change is the fast path's, not a repair.
	write(t, b, nsYAML("b3"))
	src.rescan(w, map[string]bool{b: true})
	if got := src.Status().Repairs; got != 6 {
		t.Errorf("a change the watcher named counted as a repair: %d repairs, want 6", got)
	}
}

// TestRacyReadIsReadAgain: a file read within racyWindow of its last
// change is read again by the next full scan, which finds a change that
// kept its size and times (the kernel's timestamps are coarse).
func TestRacyReadIsReadAgain(t *testing.T) {
	dir := t.TempDir()
	src, store, w := scanner(t, dir)
	path := filepath.Join(dir, "a.yaml")
	write(t, path, nsYAML("a1"))
	src.rescan(w, nil)
	src.mu.Lock()
	f := *src.files[path]
	src.mu.Unlock()
	if !f.racy {
		t.Fatal("a file read just after it was written is not marked racy")
	}
	// The same bytes' length, the same times as recorded: the stat alone
	// cannot tell. (The change time moves; set the record's to match.)
	write(t, path, nsYAML("a2"))
	if err := os.Chtimes(path, f.modTime, f.modTime); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.files[path].ctime = changeTime(st)
	src.mu.Unlock()
	src.rescan(w, nil)
	if got := storeKeys(store); !slices.Equal(got, []string{"Namespace a2"}) {
		t.Errorf("store %v after a full scan, want the racy file read again", got)
	}
}

// TestStatusTellsTheTruth: "synced" holds only while the last full scan
// found the files read whole and the Store in step; the description says
// when that scan was and how many files it read.
func TestStatusTellsTheTruth(t *testing.T) {
	dir := t.TempDir()
	src, _, w := scanner(t, dir)
	if got := src.Status().ClusterState("synced"); got != "loading" {
		t.Errorf("before any full scan: %q, want loading", got)
	}
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a"))
	write(t, filepath.Join(dir, "b.yaml"), nsYAML("b"))
	src.rescan(w, nil)
	st := src.Status()
	if got := st.ClusterState("synced"); got != "synced" {
		t.Errorf("after a full scan of good files: %q, want synced", got)
	}
	if got, want := st.Describe(st.LastFullScan.Add(3*time.Second)), "2 files, 2 read; 0 repairs since start"; !strings.Contains(got, want) || !strings.Contains(got, "(3s ago)") {
		t.Errorf("Describe = %q, want it to say %q and 3s ago", got, want)
	}
	write(t, filepath.Join(dir, "b.yaml"), "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n   broken: [\n")
	src.rescan(w, nil)
	if got := src.Status().ClusterState("synced"); !strings.Contains(got, "out of step") {
		t.Errorf("with a file that does not parse: %q, want out of step", got)
	}
}
