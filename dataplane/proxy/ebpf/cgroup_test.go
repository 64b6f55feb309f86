package ebpf

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/roottest"
)

// The one --bpf-cgroup value a DaemonSet passes, the host's /sys/fs/cgroup,
// must name the v2 hierarchy on unified and hybrid hosts alike.
func TestResolveCgroup(t *testing.T) {
	root, err := Cgroup2Root()
	if err != nil {
		roottest.Unavailable(t, "%v", err)
	}
	if got, err := ResolveCgroup(root); err != nil || got != root {
		t.Errorf("ResolveCgroup(%s) = %q, %v; want it as it is", root, got, err)
	}
	if filepath.Base(root) == hybridUnified {
		parent := filepath.Dir(root)
		if got, err := ResolveCgroup(parent); err != nil || got != root {
			t.Errorf("ResolveCgroup(%s) on a hybrid host = %q, %v; want %s", parent, got, err, root)
		}
	}
	dir := t.TempDir()
	if got, err := ResolveCgroup(dir); err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "not a cgroup v2 directory") {
		t.Errorf("ResolveCgroup(%s) = %q, %v; want an error naming it", dir, got, err)
	}
}
