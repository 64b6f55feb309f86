package statedir

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/runner"
)

const nodesYAML = `apiVersion: v1
kind: Node
metadata:
  name: node1
spec:
  podCIDR: 10.244.1.0/24
status:
  addresses:
  - type: InternalIP
    address: 192.168.10.11
---
# a comment-only document is skipped
---
apiVersion: v1
kind: Node
metadata:
  name: node2
spec:
  podCIDRs: [10.244.2.0/24]
status:
  addresses:
  - {type: InternalIP, address: 192.168.10.12}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ignored
`

const listYAML = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: web
    namespace: shop
  spec:
    clusterIP: 10.96.0.20
    ports:
    - port: 80
      targetPort: 8080
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-1
    namespace: shop
    labels:
      kubernetes.io/service-name: web
  addressType: IPv4
  ports:
  - port: 8080
  endpoints:
  - addresses: [10.244.1.5]
    conditions: {}
  - addresses: [10.244.2.5]
    conditions: {ready: false}
`

const nsJSON = `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "shop"},
   "spec": {"nodeName": "node1"}, "status": {"podIP": "10.244.1.5"}}
]}
`

func TestParseFile(t *testing.T) {
	parsed, err := ParseFile("nodes.yaml", []byte(nodesYAML), convert.Limits{})
	objs, ignored := parsed.Objects, parsed.Ignored
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(objs); !slices.Equal(got, []string{"Node node1", "Node node2"}) {
		t.Errorf("nodes.yaml objects = %v", got)
	}
	if n := objs[1].(*cluster.Node); n.PodCIDRs[0] != netip.MustParsePrefix("10.244.2.0/24") || n.InternalIPs[0] != netip.MustParseAddr("192.168.10.12") {
		t.Errorf("node2 = %+v", n)
	}
	if len(ignored) != 1 || ignored[0].Kind != "Deployment" || ignored[0].Line != 24 {
		t.Errorf("ignored = %+v, want the Deployment at line 24", ignored)
	}

	parsed, err = ParseFile("svc.yml", []byte(listYAML), convert.Limits{})
	objs = parsed.Objects
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(objs); !slices.Equal(got, []string{"Service shop/web", "EndpointSlice shop/web-1"}) {
		t.Errorf("list objects = %v", got)
	}
	es := objs[1].(*cluster.EndpointSlice)
	if es.ServiceName != "web" || !es.Endpoints[0].Ready || !es.Endpoints[0].Serving || es.Endpoints[1].Ready || es.Endpoints[1].Serving || es.Ports[0].Protocol != cluster.TCP {
		t.Errorf("slice = %+v", es)
	}

	parsed, err = ParseFile("ns.json", []byte(nsJSON), convert.Limits{})
	objs = parsed.Objects
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(objs); !slices.Equal(got, []string{"Namespace shop", "Pod shop/web-0"}) {
		t.Errorf("json objects = %v", got)
	}
}

func TestParseTypedList(t *testing.T) {
	parsed, err := ParseFile("es.yaml", []byte(`apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-1, namespace: x, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: [{addresses: [10.244.1.7]}]
`), convert.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(parsed.Objects); !slices.Equal(got, []string{"EndpointSlice x/a-1"}) {
		t.Errorf("objects = %v", got)
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		name, path, data string
		line             int
	}{
		{"yaml syntax in second document", "a.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n   bad: indent\n", 9},
		{"bad field type", "b.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  ports: [{port: eighty}]\n", 5},
		{"bad address", "c.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.96.0.999}\n", 1},
		{"no kind", "d.yaml", "metadata: {name: a}\n", 1},
		{"bad item in a List", "f.yaml", "# header\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n  spec: {clusterIP: 10.96.0.999}\n", 9},
		{"json syntax", "e.json", "{\"apiVersion\": \"v1\",\n \"kind\": \"Namespace\",\n \"metadata\": {\"name\": \"a\"},,\n}\n", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parsed, err := ParseFile(tt.path, []byte(tt.data), convert.Limits{})
			if err == nil && len(parsed.Refused) == 1 {
				// An object that decodes but is invalid is refused alone.
				err = parsed.Refused[0].Err
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
			}
			if pe.Path != tt.path || pe.Line != tt.line {
				t.Errorf("error at %s:%d, want %s:%d (%v)", pe.Path, pe.Line, tt.path, tt.line, err)
			}
			if !strings.HasPrefix(err.Error(), tt.path+":") {
				t.Errorf("message %q does not start with the path", err)
			}
		})
	}
}

func keys(objs []cluster.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Kind().String()+" "+o.Key().String())
	}
	return out
}

func storeKeys(s *cluster.Store) []string {
	var out []string
	for k := cluster.KindNode; k <= cluster.KindPod; k++ {
		out = append(out, keys(s.List(k))...)
	}
	slices.Sort(out)
	return out
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond for up to 2 s: the source must pick changes up within
// 1 s, this leaves slack for a loaded CI machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func nsYAML(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		b.WriteString("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + n + "\n")
	}
	return b.String()
}

func TestSourceFollowsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "nodes.yaml"), nodesYAML)
	write(t, filepath.Join(dir, "sub", "svc.yml"), listYAML)
	write(t, filepath.Join(dir, "notes.txt"), "not state")
	write(t, filepath.Join(dir, ".hidden.yaml"), nsYAML("hidden"))

	// A long rescan period proves the watcher, not the safety net, does the work.
	src, store := startSource(t, Options{Dir: dir, Rescan: time.Hour, Debounce: 100 * time.Millisecond})
	select {
	case <-store.Synced():
	case <-time.After(2 * time.Second):
		t.Fatal("store never synced")
	}
	want := []string{"EndpointSlice shop/web-1", "Node node1", "Node node2", "Service shop/web"}
	if got := storeKeys(store); !slices.Equal(got, want) {
		t.Fatalf("initial store = %v, want %v", got, want)
	}

	// A new file in a new subdirectory.
	write(t, filepath.Join(dir, "new", "deeper", "ns.json"), nsJSON)
	waitFor(t, "new file", func() bool { return store.Get(cluster.KindPod, cluster.Key{Namespace: "shop", Name: "web-0"}) != nil })

	// A change to an existing file.
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a1"))
	waitFor(t, "a1", func() bool { return store.Get(cluster.KindNamespace, cluster.Key{Name: "a1"}) != nil })
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a2"))
	waitFor(t, "a1 replaced by a2", func() bool {
		return store.Get(cluster.KindNamespace, cluster.Key{Name: "a1"}) == nil &&
			store.Get(cluster.KindNamespace, cluster.Key{Name: "a2"}) != nil
	})

	// A broken edit keeps the file's last good objects and is reported with its line.
	write(t, filepath.Join(dir, "a.yaml"), "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a3\n   broken: [\n")
	waitFor(t, "parse error", func() bool { return src.FileErrors()[filepath.Join(dir, "a.yaml")] != nil })
	var pe *ParseError
	if err := src.FileErrors()[filepath.Join(dir, "a.yaml")]; !errors.As(err, &pe) || pe.Line != 5 {
		t.Errorf("file error = %v, want a ParseError at line 5", err)
	}
	if store.Get(cluster.KindNamespace, cluster.Key{Name: "a2"}) == nil {
		t.Error("a broken edit dropped the file's last good objects")
	}
	if store.Node("node1") == nil {
		t.Error("a broken file took down another file's objects")
	}
	// Other files keep being followed while one is broken.
	write(t, filepath.Join(dir, "b.yaml"), nsYAML("b"))
	waitFor(t, "b while a is broken", func() bool { return store.Get(cluster.KindNamespace, cluster.Key{Name: "b"}) != nil })

	// The fix is picked up and the error cleared.
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a3"))
	waitFor(t, "fix", func() bool {
		return store.Get(cluster.KindNamespace, cluster.Key{Name: "a3"}) != nil && len(src.FileErrors()) == 0
	})
	if store.Get(cluster.KindNamespace, cluster.Key{Name: "a2"}) != nil {
		t.Error("a2 still present after the fixed file no longer holds it")
	}

	// Deleting a file removes its objects.
	if err := os.Remove(filepath.Join(dir, "nodes.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node removal", func() bool { return len(store.Nodes()) == 0 })

	// Atomic replacement by rename, the way editors and the lab write.
	tmp := filepath.Join(dir, ".b.yaml.tmp")
	write(t, tmp, nsYAML("b2"))
	if err := os.Rename(tmp, filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "renamed-in file", func() bool {
		return store.Get(cluster.KindNamespace, cluster.Key{Name: "b2"}) != nil && store.Get(cluster.KindNamespace, cluster.Key{Name: "b"}) == nil
	})
	if store.Get(cluster.KindNamespace, cluster.Key{Name: "hidden"}) != nil {
		t.Error("hidden files must be ignored")
	}
}

func TestSourceDuplicatesLastFileWins(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "apiVersion: v1\nkind: Node\nmetadata: {name: dup}\nspec: {podCIDR: 10.244.1.0/24}\n")
	write(t, filepath.Join(dir, "b.yaml"), "apiVersion: v1\nkind: Node\nmetadata: {name: dup}\nspec: {podCIDR: 10.244.2.0/24}\n")
	store := cluster.NewStore()
	src := New(Options{Dir: dir, Store: store, Rescan: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-store.Synced()
	n := store.Node("dup")
	if n == nil || n.PodCIDRs[0] != netip.MustParsePrefix("10.244.2.0/24") {
		t.Fatalf("node = %+v, want b.yaml's version", n)
	}
}

func TestSourceOwnsOnlyItsKinds(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), nodesYAML+"---\n"+nsYAML("x"))
	store := cluster.NewStore()
	store.Upsert(&cluster.Namespace{Name: "from-elsewhere"})
	src := New(Options{Dir: dir, Store: store, Kinds: []cluster.Kind{cluster.KindNode}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-store.Synced()
	want := []string{"Namespace from-elsewhere", "Node node1", "Node node2"}
	if got := storeKeys(store); !slices.Equal(got, want) {
		t.Errorf("store = %v, want %v", got, want)
	}
}

func TestRunMissingDir(t *testing.T) {
	src := New(Options{Dir: filepath.Join(t.TempDir(), "nope"), Store: cluster.NewStore()})
	if err := src.Run(context.Background()); err == nil {
		t.Fatal("want an error for a missing directory")
	}
}

// outOfRangeYAML: a good Service, then three the API server would refuse
// (port 70000 wrapped to 4464, nodePort 99999 to 34463, and a cluster IP
// outside the service range took that address over for pods), one of them
// inside a List.
const outOfRangeYAML = `apiVersion: v1
kind: Service
metadata: {name: good}
spec: {clusterIP: 10.96.0.20, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: bigport}
spec: {clusterIP: 10.96.0.21, ports: [{port: 70000}]}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: bignodeport, namespace: shop}
  spec: {type: NodePort, clusterIP: 10.96.0.22, ports: [{port: 80, nodePort: 99999}]}
- apiVersion: v1
  kind: Service
  metadata: {name: outside}
  spec: {clusterIP: 8.8.8.8, ports: [{port: 53, protocol: UDP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: good-1, labels: {kubernetes.io/service-name: good}}
  addressType: IPv4
  ports: [{port: 0}]
  endpoints: [{addresses: [10.244.1.7]}]
`

func TestParseRefusesOutOfRangeValuesPerObject(t *testing.T) {
	parsed, err := ParseFile("svc.yaml", []byte(outOfRangeYAML), convert.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(parsed.Objects); !slices.Equal(got, []string{"Service default/good"}) {
		t.Errorf("objects %v, want only the good Service", got)
	}
	want := []struct {
		key   string
		line  int
		field string
	}{
		{"Service default/bigport", 6, "spec.ports[0].port: 70000"},
		{"Service shop/bignodeport", 14, "spec.ports[0].nodePort: 99999 is outside the node port range 30000-32767"},
		{"Service default/outside", 18, "spec.clusterIP: 8.8.8.8 is not in the service range 10.96.0.0/12"},
		{"EndpointSlice default/good-1", 22, "ports[0].port: 0"},
	}
	if len(parsed.Refused) != len(want) {
		t.Fatalf("refused %d objects, want %d: %+v", len(parsed.Refused), len(want), parsed.Refused)
	}
	for i, w := range want {
		r := parsed.Refused[i]
		if got := r.Kind.String() + " " + r.Key.String(); got != w.key || r.Err.Line != w.line || r.Err.Path != "svc.yaml" || !strings.Contains(r.Err.Error(), w.field) {
			t.Errorf("refusal %d: %s at %s:%d: %v; want %s at line %d naming %q", i, got, r.Err.Path, r.Err.Line, r.Err, w.key, w.line, w.field)
		}
	}
	// Another service range and node-port range change the verdicts.
	parsed, err = ParseFile("svc.yaml", []byte(outOfRangeYAML), convert.Limits{
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("8.8.8.0/24")}, NodePorts: convert.PortRange{Min: 30000, Max: 99999}})
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	for _, r := range parsed.Refused {
		refused = append(refused, r.Key.Name)
	}
	// Their 10.96 cluster IPs are now outside the range; 8.8.8.8 and nodePort 99999 are in.
	if want := []string{"good", "bigport", "bignodeport", "good-1"}; !slices.Equal(refused, want) {
		t.Errorf("with range 8.8.8.0/24 and node ports 30000-99999: refused %v, want %v", refused, want)
	}
}

// TestSourceKeepsTheLastGoodVersionOfARefusedObject: an edit that puts a
// Service out of range keeps the Service as it was (the API server would
// have refused the update) while the rest of the file's changes apply.
func TestSourceKeepsTheLastGoodVersionOfARefusedObject(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svc.yaml")
	svc := func(name, ip string, port int) string {
		return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {clusterIP: " + ip + ", ports: [{port: " + strconv.Itoa(port) + "}]}\n"
	}
	write(t, path, svc("a", "10.96.0.30", 80)+svc("b", "10.96.0.31", 80))
	store := cluster.NewStore()
	src := New(Options{Dir: dir, Store: store, Debounce: 10 * time.Millisecond, Rescan: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go src.Run(ctx)
	waitFor(t, "sync", func() bool { return len(store.Services()) == 2 })
	write(t, path, svc("a", "10.96.0.30", 70000)+svc("b", "10.96.0.31", 81)+svc("c", "1.1.1.1", 80))
	waitFor(t, "b's change", func() bool {
		b := store.Service(cluster.Key{Namespace: "default", Name: "b"})
		return b != nil && b.Ports[0].Port == 81
	})
	if a := store.Service(cluster.Key{Namespace: "default", Name: "a"}); a == nil || a.Ports[0].Port != 80 {
		t.Errorf("refused update of a: store holds %+v, want the previous version (port 80)", a)
	}
	if c := store.Service(cluster.Key{Namespace: "default", Name: "c"}); c != nil {
		t.Errorf("new Service with a cluster IP outside the range is in the store: %+v", c)
	}
	if err := src.FileErrors()[path]; err == nil || !strings.Contains(err.Error(), "spec.ports[0].port: 70000") || !strings.Contains(err.Error(), "1.1.1.1") {
		t.Errorf("file errors %v, want both refusals named", err)
	}
}

func startSource(t *testing.T, o Options) (*Source, *cluster.Store) {
	t.Helper()
	o.Store = cluster.NewStore()
	if o.Debounce == 0 {
		o.Debounce = 10 * time.Millisecond
	}
	src := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return src, o.Store
}

func synced(s *cluster.Store) bool {
	select {
	case <-s.Synced():
		return true
	default:
		return false
	}
}

// TestSourceNotSyncedUntilReadWhole: a daemon started while a file is broken
// or unreadable must not take the rest for the whole cluster (proxyd would
// drop that file's Services, dnsd answer NXDOMAIN for them): the Store stays
// unsynced, saying why, until every file reads whole.
func TestSourceNotSyncedUntilReadWhole(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a"))
	write(t, filepath.Join(dir, "b.yaml"), "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n   broken: [\n")
	// Unreadable even for root: a name that is a link to a directory.
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	src, store := startSource(t, Options{Dir: dir, Rescan: time.Hour})
	// The first scan has ended once Err names what it could not read;
	// the Store must not be synced then, nor by any scan after (nothing
	// changes until b.yaml is written).
	errNames := func(b, c bool) bool {
		err := src.Err()
		return err != nil && strings.Contains(err.Error(), "b.yaml:5") == b && strings.Contains(err.Error(), "c.yaml: read") == c
	}
	waitFor(t, "the first scan to name both files", func() bool { return errNames(true, true) })
	if synced(store) {
		t.Fatalf("store synced with b.yaml broken and c.yaml unreadable; it holds %v", storeKeys(store))
	}
	write(t, filepath.Join(dir, "b.yaml"), nsYAML("b"))
	waitFor(t, "b.yaml read again", func() bool { return errNames(false, true) })
	if synced(store) {
		t.Fatal("store synced with c.yaml unreadable")
	}
	// Replaced in one step: a scan between a removal and a write would
	// rightly sync without c.
	write(t, filepath.Join(dir, ".c.tmp"), nsYAML("c"))
	if err := os.Rename(filepath.Join(dir, ".c.tmp"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sync once every file reads", func() bool { return synced(store) })
	if got := storeKeys(store); !slices.Equal(got, []string{"Namespace a", "Namespace b", "Namespace c"}) {
		t.Errorf("store %v", got)
	}
	if err := src.Err(); err != nil {
		t.Errorf("Err() after sync: %v", err)
	}

	// After sync, a file that becomes unreadable keeps its objects.
	tmp := filepath.Join(dir, ".link")
	if err := os.Symlink(t.TempDir(), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "read error reported", func() bool { return src.FileErrors()[filepath.Join(dir, "c.yaml")] != nil })
	if store.Get(cluster.KindNamespace, cluster.Key{Name: "c"}) == nil {
		t.Error("a file that became unreadable dropped its objects")
	}
}

// TestSourceShrinkInPlaceSettles: a file rewritten in place is truncated
// before it is written; what is read in between (empty, or the first
// documents) is a prefix of the old content and is believed only if it
// stays so for Settle. A file replaced by rename is believed at once. On a
// driven clock: "not believed before Settle" is exact at any load.
func TestSourceShrinkInPlaceSettles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ns.yaml")
	all := nsYAML("a", "b", "c")
	write(t, path, all)
	const debounce, settle, rescan = 10 * time.Millisecond, 400 * time.Millisecond, time.Hour
	clock := runner.NewFakeClock()
	src, store := startSource(t, Options{Dir: dir, Rescan: rescan, Settle: settle, Debounce: debounce, Clock: clock})
	waitFor(t, "sync", func() bool { return synced(store) && len(store.List(cluster.KindNamespace)) == 3 })
	var deleted atomic.Int32
	store.Subscribe(func(ev cluster.Event) {
		if ev.New == nil {
			deleted.Add(1)
		}
	})
	// advance moves the clock on by d and waits for the run that brings
	// to end.
	advance := func(d time.Duration) {
		t.Helper()
		n := src.steps.Load()
		clock.Advance(d)
		waitFor(t, "the Source's run", func() bool { return src.steps.Load() > n })
	}
	// read lets the debounce of the change just made pass and waits for
	// the scan it brings to end.
	read := func(what string) {
		t.Helper()
		armed(t, clock, clock.Now().Add(debounce))
		advance(debounce)
	}

	// Truncated, then written again in two steps: never seen with fewer
	// objects.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	read("truncated")
	src.mu.Lock()
	shrunk := !src.files[path].shrunkSince.IsZero()
	src.mu.Unlock()
	if !shrunk {
		t.Fatal("a file truncated in place is not waiting to settle")
	}
	f.WriteString(nsYAML("a"))
	read("first document")
	f.WriteString(all[len(nsYAML("a")):])
	f.Close()
	read("whole again")
	advance(settle) // the settle run asked for at the truncation
	if n := deleted.Load(); n != 0 {
		t.Errorf("during an in-place rewrite the store lost %d of 3 Namespaces", n)
	}

	// A real shrink in place is believed after Settle, not before.
	write(t, path, nsYAML("a"))
	read("shrunk")
	clock.Advance(settle - time.Millisecond) // no timer is due: nothing runs
	if n := len(store.List(cluster.KindNamespace)); n != 3 {
		t.Fatalf("shrink in place believed before the settle interval: %d Namespaces", n)
	}
	advance(time.Millisecond)
	waitFor(t, "shrink believed", func() bool { return len(store.List(cluster.KindNamespace)) == 1 })

	// By rename: at once.
	write(t, path, all)
	read("grown back")
	waitFor(t, "grown back", func() bool { return len(store.List(cluster.KindNamespace)) == 3 })
	tmp := filepath.Join(dir, ".ns.yaml.tmp")
	write(t, tmp, "")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	read("renamed")
	if n := len(store.List(cluster.KindNamespace)); n != 0 {
		t.Errorf("a file replaced by rename not believed at once: %d Namespaces", n)
	}
}

// armed waits until c has a timer armed for at: the Source's runner is
// waiting for that time.
func armed(t *testing.T, c *runner.FakeClock, at time.Time) {
	t.Helper()
	waitFor(t, "a timer at "+at.String(), func() bool { return slices.ContainsFunc(c.Pending(), at.Equal) })
}

// TestIncrementalMatchesFullLoad: after every change to a file (objects
// added, changed, removed, moved between files, held by several files, the
// file deleted), the Store a Source brings up to date object by object
// holds what a new Source reading the directory from scratch would.
func TestIncrementalMatchesFullLoad(t *testing.T) {
	dir := t.TempDir()
	rnd := rand.New(rand.NewPCG(1, 2))
	src, store, w := scanner(t, dir)
	for step := range 120 {
		path := filepath.Join(dir, fmt.Sprintf("f%d.yaml", rnd.IntN(4)))
		if rnd.IntN(6) == 0 {
			os.Remove(path)
		} else {
			// A header unique to the step: never a prefix of what the
			// file held, which would wait to settle.
			var b strings.Builder
			fmt.Fprintf(&b, "# step %d\n", step)
			for range rnd.IntN(6) {
				fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Node\nmetadata: {name: n%d}\nspec: {podCIDR: 10.244.%d.0/24}\n", rnd.IntN(8), rnd.IntN(3))
				fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ns%d}\n", rnd.IntN(8))
			}
			write(t, path, b.String())
		}
		src.scan(w, map[string]bool{path: true})

		fresh := cluster.NewStore()
		New(Options{Dir: dir, Store: fresh}).scan(w, nil)
		for k := cluster.KindNode; k <= cluster.KindPod; k++ {
			got, want := byKey(store.List(k)), byKey(fresh.List(k))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d, %s: incremental store %v, a full load %v", step, k, got, want)
			}
		}
	}
}

func byKey(objs []cluster.Object) map[cluster.Key]cluster.Object {
	out := make(map[cluster.Key]cluster.Object, len(objs))
	for _, o := range objs {
		out[o.Key()] = o
	}
	return out
}

// TestScanOfNamedFiles: a scan the watcher triggers reads the files it
// names without a walk, but a name that is a directory, or is gone and may
// have been one, walks: a new directory's files are read, a removed one's
// dropped, and a file nobody named is left for the rescan.
func TestScanOfNamedFiles(t *testing.T) {
	dir := t.TempDir()
	src, store, w := scanner(t, dir)
	write(t, filepath.Join(dir, "a.yaml"), nsYAML("a"))
	src.scan(w, nil)

	write(t, filepath.Join(dir, "unnamed.yaml"), nsYAML("unnamed"))
	write(t, filepath.Join(dir, "b.yaml"), nsYAML("b"))
	write(t, filepath.Join(dir, "notes.txt"), "not state")
	src.scan(w, map[string]bool{filepath.Join(dir, "b.yaml"): true, filepath.Join(dir, ".b.yaml.tmp"): true, filepath.Join(dir, "notes.txt"): true})
	if got, want := storeKeys(store), []string{"Namespace a", "Namespace b"}; !slices.Equal(got, want) {
		t.Fatalf("after a named file: %v, want %v (the unnamed file left for the rescan)", got, want)
	}

	write(t, filepath.Join(dir, "sub", "c.yaml"), nsYAML("c"))
	src.scan(w, map[string]bool{filepath.Join(dir, "sub"): true})
	if got, want := storeKeys(store), []string{"Namespace a", "Namespace b", "Namespace c", "Namespace unnamed"}; !slices.Equal(got, want) {
		t.Fatalf("after a new directory: %v, want %v", got, want)
	}

	if err := os.RemoveAll(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	src.scan(w, map[string]bool{filepath.Join(dir, "b.yaml"): true})
	if got, want := storeKeys(store), []string{"Namespace a", "Namespace c", "Namespace unnamed"}; !slices.Equal(got, want) {
		t.Fatalf("after a named file removed: %v, want %v", got, want)
	}
	src.scan(w, map[string]bool{filepath.Join(dir, "sub"): true})
	if got, want := storeKeys(store), []string{"Namespace a", "Namespace unnamed"}; !slices.Equal(got, want) {
		t.Fatalf("after a directory removed: %v, want %v", got, want)
	}
}

// scanner is a Source of dir for a test to scan by hand, with the watcher
// its scans add directories to.
func scanner(t *testing.T, dir string) (*Source, *cluster.Store, *fsnotify.Watcher) {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	store := cluster.NewStore()
	return New(Options{Dir: dir, Store: store}), store, w
}
