package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

// TestStateHealthSaysWhyTheStateIsNotLoaded: while the source cannot read
// the whole state (a state file broken or unreadable at start), /healthz
// names the cause and that the kernel's rules are left alone; once the
// Store is synced the component is healthy, and stale while the source
// says so. Health is asked, not polled: each read has the state of then.
func TestStateHealthSaysWhyTheStateIsNotLoaded(t *testing.T) {
	store := cluster.NewStore()
	var stale error
	src := app.Source{Store: store, Stale: func() error { return stale }}
	checker := health.NewChecker()
	checkState(checker, src)
	if err := checker.Err(); err == nil || !strings.Contains(err.Error(), "cluster state not loaded yet") {
		t.Fatalf("health before the state is read: %v; want not loaded", err)
	}
	stale = errors.New("state directory not read whole: /state/web.yaml:7: did not find expected key")
	if err := checker.Err(); err == nil || !strings.Contains(err.Error(), "web.yaml:7") {
		t.Fatalf("health while the state is half read: %v; want the file named", err)
	}
	if err := checker.Err(); !strings.Contains(err.Error(), "kernel rules left as they are") {
		t.Errorf("health %v does not say the kernel is left alone", err)
	}
	stale = nil
	store.MarkSynced()
	if err := checker.Err(); err != nil {
		t.Fatalf("health once the state is synced: %v", err)
	}
	stale = errors.New("cluster state stale since 2026-11-27T19:00:00Z: watch services: connection refused")
	if err := checker.Err(); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("health while the API server is away: %v; want stale, naming why", err)
	}
}
