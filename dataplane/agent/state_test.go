package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

// TestWatchStateSaysWhyTheStateIsNotLoaded: while the source cannot read
// the whole state (a state file broken or unreadable at start), /healthz
// names the cause and that the kernel's rules are left alone; once the
// Store is synced the component is healthy.
func TestWatchStateSaysWhyTheStateIsNotLoaded(t *testing.T) {
	store := cluster.NewStore()
	src := app.Source{Store: store, Stale: func() error {
		select {
		case <-store.Synced():
			return nil
		default:
			return errors.New("state directory not read whole: /state/web.yaml:7: did not find expected key")
		}
	}}
	checker := health.NewChecker()
	checker.Set(componentState, errors.New("cluster state not loaded yet"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- watchState(ctx, src, checker, slog.New(slog.DiscardHandler)) }()

	deadline := time.Now().Add(3 * time.Second)
	for err := checker.Err(); err == nil || !strings.Contains(err.Error(), "web.yaml:7"); err = checker.Err() {
		if time.Now().After(deadline) {
			t.Fatalf("health while the state is half read: %v; want the file named", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := checker.Err(); !strings.Contains(err.Error(), "kernel rules left as they are") {
		t.Errorf("health %v does not say the kernel is left alone", err)
	}
	store.MarkSynced()
	deadline = time.Now().Add(3 * time.Second)
	for checker.Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("health after sync: %v", checker.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watchState: %v", err)
	}
}
