package ebpf

import (
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
)

// TestCompareSlashed: full syncs are ordered as "namespace/name" strings
// sort, without building them.
func TestCompareSlashed(t *testing.T) {
	names := []string{"", "a", "a-b", "a/b", "ab", "b", "a.b", "z", "kube-system", "kube"}
	for _, an := range names {
		for _, aname := range names {
			for _, bn := range names {
				for _, bname := range names {
					a, b := cluster.Key{Namespace: an, Name: aname}, cluster.Key{Namespace: bn, Name: bname}
					want := strings.Compare(an+"/"+aname, bn+"/"+bname)
					if got := compareSlashed(a, b); got != want {
						t.Fatalf("compareSlashed(%q, %q) = %d, want %d", an+"/"+aname, bn+"/"+bname, got, want)
					}
				}
			}
		}
	}
}
