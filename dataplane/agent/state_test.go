package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
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
	// In a synctest bubble: watchState's ticker runs on the bubble's
	// clock, and synctest.Wait says when it has done what a tick does.
	synctest.Test(t, func(t *testing.T) {
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
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- watchState(ctx, src, checker, slog.New(slog.DiscardHandler)) }()

		time.Sleep(time.Second) // one tick
		synctest.Wait()
		if err := checker.Err(); err == nil || !strings.Contains(err.Error(), "web.yaml:7") {
			t.Fatalf("health while the state is half read: %v; want the file named", err)
		}
		if err := checker.Err(); !strings.Contains(err.Error(), "kernel rules left as they are") {
			t.Errorf("health %v does not say the kernel is left alone", err)
		}
		store.MarkSynced()
		synctest.Wait()
		if err := checker.Err(); err != nil {
			t.Fatalf("health once the state is synced: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchState: %v", err)
		}
	})
}
