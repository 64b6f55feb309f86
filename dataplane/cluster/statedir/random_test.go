package statedir

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// churn writes a state directory the ways people and programs do, from
// several goroutines at once: each goroutine owns a few file names (two
// writers of one file in place would leave garbage no reader could
// follow), and one owns a ConfigMap-style subdirectory whose files are
// links through a `..data` link that is swapped whole.
type churn struct {
	dir  string
	seq  chan int // unique step numbers: no content is a prefix of another
	errs chan error
}

func newChurn(dir string) *churn {
	c := &churn{dir: dir, seq: make(chan int), errs: make(chan error, 64)}
	go func() {
		for i := 0; ; i++ {
			c.seq <- i
		}
	}()
	return c
}

// content is what a file of this name holds at one step: up to three
// Services and a Namespace, named from a small pool so files hold the same
// objects at times (the last file in sorted order wins). JSON files get a
// List, whose resourceVersion makes each version unique.
func (c *churn) content(path string, rnd *rand.Rand) []byte {
	step := <-c.seq
	var items []string
	for range rnd.IntN(4) {
		n := rnd.IntN(40)
		items = append(items, fmt.Sprintf(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s%d", "namespace": "ns%d"}, "spec": {"clusterIP": "10.96.1.%d", "ports": [{"port": %d}]}}`,
			n, n%3, n+1, 80+rnd.IntN(3)))
	}
	if rnd.IntN(3) == 0 {
		items = append(items, fmt.Sprintf(`{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns%d"}}`, rnd.IntN(5)))
	}
	if strings.HasSuffix(path, ".json") {
		return fmt.Appendf(nil, `{"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "%d"}, "items": [%s]}`+"\n", step, strings.Join(items, ",\n"))
	}
	// JSON is YAML too, one document each.
	return fmt.Appendf(nil, "# step %d\n---\n%s\n", step, strings.Join(items, "\n---\n"))
}

func (c *churn) fail(err error) {
	select {
	case c.errs <- err:
	default:
	}
}

// files runs ops operations on the names goroutine g owns, a short random
// pause before each.
func (c *churn) files(g, ops int, rnd *rand.Rand) {
	names := []string{
		filepath.Join(c.dir, fmt.Sprintf("g%d-a.yaml", g)),
		filepath.Join(c.dir, fmt.Sprintf("g%d-b.yml", g)),
		filepath.Join(c.dir, fmt.Sprintf("g%d-c.json", g)),
		filepath.Join(c.dir, "sub", fmt.Sprintf("g%d-d.yaml", g)),
		filepath.Join(c.dir, "sub", fmt.Sprintf("g%d-e.yaml", g)),
		filepath.Join(c.dir, "sub", fmt.Sprintf("g%d-f.json", g)),
	}
	for range ops {
		time.Sleep(time.Duration(rnd.IntN(1500)) * time.Microsecond)
		path := names[rnd.IntN(len(names))]
		switch op := rnd.IntN(10); {
		case op < 3: // in place: truncated, then written
			c.check(os.WriteFile(path, c.content(path, rnd), 0o644))
		case op < 7: // safely: a temporary file renamed over the name
			tmp := path + ".tmp" // as the issue's `mv NAME.yaml.tmp NAME.yaml`
			if op == 6 {
				tmp = filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
			}
			c.check(os.WriteFile(tmp, c.content(path, rnd), 0o644))
			c.check(os.Rename(tmp, path))
		case op < 8:
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				c.fail(err)
			}
		default: // one name renamed over another (JSON over JSON: the name says how to parse)
			from := names[rnd.IntN(len(names))]
			if strings.HasSuffix(from, ".json") != strings.HasSuffix(path, ".json") {
				continue
			}
			if err := os.Rename(from, path); err != nil && !os.IsNotExist(err) {
				c.fail(err)
			}
		}
	}
}

// configMap swaps the `..data` link of dir/cm as the kubelet updates a
// ConfigMap volume: a new timestamped directory with every key, a link to
// it renamed over `..data`, the old directory removed; the visible names
// are links through `..data`, made when a key appears, removed when it
// goes.
func (c *churn) configMap(ops int, rnd *rand.Rand) {
	cm := filepath.Join(c.dir, "cm")
	keys := []string{"k1.yaml", "k2.yaml", "k3.json"}
	old := ""
	for range ops {
		time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond)
		ts := filepath.Join(cm, fmt.Sprintf("..ts-%d", <-c.seq))
		c.check(os.MkdirAll(ts, 0o755))
		var present []string
		for _, k := range keys {
			if rnd.IntN(4) != 0 {
				present = append(present, k)
				c.check(os.WriteFile(filepath.Join(ts, k), c.content(k, rnd), 0o644))
			}
		}
		tmp := filepath.Join(cm, "..data_tmp")
		c.check(os.Symlink(filepath.Base(ts), tmp))
		c.check(os.Rename(tmp, filepath.Join(cm, "..data")))
		for _, k := range keys {
			link := filepath.Join(cm, k)
			_, err := os.Lstat(link)
			switch want := contains(present, k); {
			case want && os.IsNotExist(err):
				c.check(os.Symlink(filepath.Join("..data", k), link))
			case !want && err == nil:
				c.check(os.Remove(link))
			}
		}
		if old != "" {
			c.check(os.RemoveAll(old))
		}
		old = ts
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func (c *churn) check(err error) {
	if err != nil {
		c.fail(err)
	}
}

// run makes one burst: writers goroutines of ops operations each beside
// the ConfigMap's swaps, and waits for them.
func (c *churn) run(t *testing.T, seed uint64, writers, ops int) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range writers {
		rnd := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() { c.files(g, ops, rnd) })
	}
	rnd := rand.New(rand.NewPCG(seed, 1000))
	wg.Go(func() { c.configMap(ops/8, rnd) })
	wg.Wait()
	select {
	case err := <-c.errs:
		t.Fatalf("writing the directory: %v", err)
	default:
	}
}

// mirror is a Store consumer as proxyd's and dnsd's are: its handler only
// records which objects changed and signals; a goroutine then reads them
// from the Store. It also checks each event against what the events before
// it said (an event's Old is the previous event's New).
type mirror struct {
	store *cluster.Store

	mu      sync.Mutex
	dirty   map[cluster.Ref]bool
	byEvent map[cluster.Ref]cluster.Object // built from the events alone
	badOld  []string
	signal  chan struct{}

	read map[cluster.Ref]cluster.Object // what the reader has read, its goroutine's
	done chan struct{}
}

func newMirror(ctx context.Context, store *cluster.Store) *mirror {
	m := &mirror{store: store, dirty: make(map[cluster.Ref]bool), byEvent: make(map[cluster.Ref]cluster.Object),
		signal: make(chan struct{}, 1), read: make(map[cluster.Ref]cluster.Object), done: make(chan struct{})}
	store.Subscribe(m.handle)
	go m.run(ctx)
	return m
}

func (m *mirror) handle(ev cluster.Event) {
	r := cluster.Ref{Kind: ev.Kind, Key: ev.Key}
	m.mu.Lock()
	if had := m.byEvent[r]; !reflect.DeepEqual(had, ev.Old) && len(m.badOld) < 5 {
		m.badOld = append(m.badOld, fmt.Sprintf("%s %s: event's Old %v, the events before said %v", ev.Kind, ev.Key, ev.Old, had))
	}
	if ev.New == nil {
		delete(m.byEvent, r)
	} else {
		m.byEvent[r] = ev.New
	}
	m.dirty[r] = true
	m.mu.Unlock()
	select {
	case m.signal <- struct{}{}:
	default:
	}
}

func (m *mirror) run(ctx context.Context) {
	defer close(m.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.signal:
		}
		m.mu.Lock()
		dirty := m.dirty
		m.dirty = make(map[cluster.Ref]bool)
		m.mu.Unlock()
		read := make(map[cluster.Ref]cluster.Object, len(dirty))
		for r := range dirty {
			read[r] = m.store.Get(r.Kind, r.Key)
		}
		m.mu.Lock()
		for r, o := range read {
			if o == nil {
				delete(m.read, r)
			} else {
				m.read[r] = o
			}
		}
		m.mu.Unlock()
	}
}

// diff says how what the consumer saw differs from the Store ("" when it
// does not).
func (m *mirror) diff() string {
	want := storeObjects(m.store)
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	if len(m.badOld) > 0 {
		out = append(out, "events out of order: "+strings.Join(m.badOld, "; "))
	}
	if d := objectsDiff(m.byEvent, want); d != "" {
		out = append(out, "the events summed up: "+d)
	}
	if d := objectsDiff(m.read, want); d != "" {
		out = append(out, "the reader read: "+d)
	}
	return strings.Join(out, "\n")
}

func storeObjects(s *cluster.Store) map[cluster.Ref]cluster.Object {
	out := make(map[cluster.Ref]cluster.Object)
	for k := cluster.KindNode; k <= cluster.KindPod; k++ {
		for _, o := range s.List(k) {
			out[cluster.Ref{Kind: k, Key: o.Key()}] = o
		}
	}
	return out
}

// objectsDiff names the objects got and want differ in, up to ten.
func objectsDiff(got, want map[cluster.Ref]cluster.Object) string {
	var out []string
	for r, w := range want {
		if g, ok := got[r]; !ok {
			out = append(out, fmt.Sprintf("%s %s missing", r.Kind, r.Key))
		} else if !reflect.DeepEqual(g, w) {
			out = append(out, fmt.Sprintf("%s %s is %+v, want %+v", r.Kind, r.Key, g, w))
		}
	}
	for r := range got {
		if _, ok := want[r]; !ok {
			out = append(out, fmt.Sprintf("%s %s extra", r.Kind, r.Key))
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("and %d more", len(out)-10))
	}
	return strings.Join(out, "; ")
}

// fullLoad is what a new Source reading dir from scratch puts in a Store.
func fullLoad(t *testing.T, dir string) (map[cluster.Ref]cluster.Object, *Source) {
	t.Helper()
	src, store, w := scanner(t, dir)
	src.scan(w, nil)
	if err := src.Err(); err != nil {
		t.Fatalf("a full load of the quiet directory: %v", err)
	}
	return storeObjects(store), src
}

// filesDiff names the files whose objects two Sources disagree on.
func filesDiff(got, want *Source) string {
	got.mu.Lock()
	defer got.mu.Unlock()
	var out []string
	for p, w := range want.files {
		g := got.files[p]
		if g == nil {
			out = append(out, p+" not held")
		} else if !reflect.DeepEqual(keys(g.objs), keys(w.objs)) {
			out = append(out, fmt.Sprintf("%s holds %v, on disk %v (size %d ino %d mtime %v; on disk size %d ino %d mtime %v)", p, keys(g.objs), keys(w.objs), g.size, g.ino, g.modTime, w.size, w.ino, w.modTime))
		}
	}
	for p := range got.files {
		if want.files[p] == nil {
			out = append(out, p+" held, not on disk")
		}
	}
	return strings.Join(out, "\n")
}

// TestRandomChurnMatchesAFullLoad: thousands of writes in place, writes by
// rename, deletions, renames over other files and ConfigMap-style swaps,
// from several goroutines at random short intervals, with the periodic
// rescan off; after each burst, once the directory is quiet, the Store
// must equal a full load of the directory, and a consumer following the
// Store's events must hold what the Store holds.
func TestRandomChurnMatchesAFullLoad(t *testing.T) {
	const rounds, writers, ops = 4, 4, 300
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Settle short: the test waits for it after every burst.
	src, store := startSource(t, Options{Dir: dir, Rescan: time.Hour, Settle: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m := newMirror(ctx, store)
	waitFor(t, "sync", func() bool { return synced(store) })
	c := newChurn(dir)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for round := range rounds {
		c.run(t, seed+uint64(round), writers, ops)
		want, fresh := fullLoad(t, dir)
		// The quiet interval: the Source picks changes up within 1 s (the
		// debounce, then a settle for files read while truncated).
		deadline := time.Now().Add(3 * time.Second)
		for objectsDiff(storeObjects(store), want) != "" || m.diff() != "" {
			if time.Now().After(deadline) {
				t.Fatalf("round %d (seed %d), quiet for 3 s:\nthe Store against a full load: %s\nthe consumer against the Store: %s\nfile errors: %v\nfiles: %s",
					round, seed, objectsDiff(storeObjects(store), want), m.diff(), src.FileErrors(), filesDiff(src, fresh))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestSixtyServicesWrittenByRename is issue 26's report: 60 Services, one
// file each, written as NAME.yaml.tmp and renamed to NAME.yaml 0-0.2 s
// apart while the Source runs (the safety-net rescan off). Every one must
// reach the Store.
func TestSixtyServicesWrittenByRename(t *testing.T) {
	dir := t.TempDir()
	_, store := startSource(t, Options{Dir: dir, Rescan: time.Hour, Debounce: 100 * time.Millisecond})
	waitFor(t, "sync", func() bool { return synced(store) })
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 26))
	for i := range 60 {
		path := filepath.Join(dir, fmt.Sprintf("svc-%02d.yaml", i))
		data := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: svc-%02d, namespace: default}\nspec: {clusterIP: 10.96.2.%d, ports: [{port: 80}]}\n", i, i+1)
		write(t, path+".tmp", data)
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rnd.IntN(200)) * time.Millisecond)
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(store.Services()) != 60 {
		if time.Now().After(deadline) {
			var missing []string
			for i := range 60 {
				if store.Service(cluster.Key{Namespace: "default", Name: fmt.Sprintf("svc-%02d", i)}) == nil {
					missing = append(missing, fmt.Sprintf("svc-%02d", i))
				}
			}
			t.Fatalf("2 s after the last write, %d of 60 Services missing: %v", len(missing), missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
