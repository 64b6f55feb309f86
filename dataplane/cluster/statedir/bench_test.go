package statedir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsnotify/fsnotify"

	"github.com/podnet/podnet/dataplane/cluster"
)

// BenchmarkOneNodeFileChange: a state directory of 5,000 Nodes, one file
// each, and 10,000 Services × 10 endpoints in one more file (115,000
// objects with the slices and namespaces); one op is one Node file
// rewritten with a new podCIDR and the scan that brings the Store up to
// date, as the watcher's debounce triggers it.
func BenchmarkOneNodeFileChange(b *testing.B) {
	dir, src, store, w := bigDir(b)
	b.ResetTimer()
	for i := range b.N {
		path := filepath.Join(dir, fmt.Sprintf("node%d.yaml", i%bigNodes))
		if err := os.WriteFile(path, []byte(bigNode(i%bigNodes, 1+i/bigNodes)), 0o644); err != nil {
			b.Fatal(err)
		}
		gen := store.Generation()
		src.scan(w, map[string]bool{path: true})
		if store.Generation() == gen {
			b.Fatalf("op %d: the Store did not change", i)
		}
	}
}

// BenchmarkFullRescan: the safety net's cost on the same directory with
// nothing changed: a walk with a stat of every file, and the Source's
// objects compared with the Store's. It runs every Rescan (5 s). The
// files are taken as old enough not to be racy (else each is read again
// once, by the first rescan more than racyWindow after its change).
func BenchmarkFullRescan(b *testing.B) {
	_, src, _, w := bigDir(b)
	src.racyWindow = 0
	src.rescan(w, nil) // the racy first reads, read again once
	b.ResetTimer()
	for range b.N {
		src.rescan(w, nil)
	}
	if st := src.Status(); st.Repairs != 0 || st.Read != 0 {
		b.Fatalf("a rescan of an unchanged directory: %+v", st)
	}
}

const bigNodes, bigServices = 5000, 10000

func bigNode(i, v int) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: node%d}\nspec: {podCIDR: 10.%d.%d.0/24}\nstatus: {addresses: [{type: InternalIP, address: 192.168.%d.%d}]}\n", i, 100+v%100, i%250, i/250, i%250+1)
}

// bigDir writes 5,000 Node files and 10,000 Services with their slices in
// one more, and loads them into a hand-scanned Source.
func bigDir(b *testing.B) (string, *Source, *cluster.Store, *fsnotify.Watcher) {
	const nodes, services = bigNodes, bigServices
	dir := b.TempDir()
	node := bigNode
	for i := range nodes {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d.yaml", i)), []byte(node(i, 0)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var y strings.Builder
	for i := range services {
		fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: default}\nspec: {clusterIP: 10.96.%d.%d, ports: [{name: p, port: 80}]}\n", i, i/250, i%250+1)
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata: {name: s%05d-x, namespace: default, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: p, port: 8080}]\nendpoints:\n", i, i)
		for j := range 10 {
			fmt.Fprintf(&y, "- {addresses: [10.%d.%d.%d], nodeName: node%d}\n", 245+j, i/250, i%250+1, (i*10+j)%nodes)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "services.yaml"), []byte(y.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	store := cluster.NewStore()
	src := New(Options{Dir: dir, Store: store})
	src.rescan(w, nil)
	return dir, src, store, w
}
